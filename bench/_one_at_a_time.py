"""A user's own loop over a campaign's trials, as a whole process (run by bench/campaign_gpu.py): start-up included.

One interpreter imports torch and gpufill's trial code, reads the campaign file, and trains its trials one after the
other with the campaign's own trial code (unfused), as `gpufill run` would train each alone. Prints one JSON line:
{trial_id: test MAE}.

    python bench/_one_at_a_time.py CAMPAIGN.yaml DEVICE THREADS(default|N)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.trials.trials import expand
from gpufill.campaign.worker.worker import TrialRunner


def main() -> None:
    path, device, threads = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if threads != "default":
        torch.set_num_threads(int(threads))
    spec = load_campaign(path)
    trials = expand(spec, {p: project.fingerprint() for p, project in spec.load_projects().items()})
    runner = TrialRunner(spec.model_dump(mode="json"), path.parent, threads=torch.get_num_threads(), device=device)
    print(json.dumps({trial.trial_id: runner.run(trial).metrics["test"]["mae"] for trial in trials}))


if __name__ == "__main__":
    main()
