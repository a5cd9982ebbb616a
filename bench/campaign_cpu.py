"""The demo campaign through gpufill against a plain sequential loop over the same trials.

    python bench/campaign_cpu.py [--quick] [--repeats N] [--campaign PATH] [--out PATH]

The sequential loop is what a researcher writes first: one process, `for trial in
trials:` train it with the same functions (same models, epochs, seeds), torch on all
cores. gpufill runs the same trials through its scheduler (lanes, slots x threads
<= cores, worker processes). Its time includes starting the workers. Reported: trials
per minute of each, their ratio, and how closely the two agree on each trial's test MAE.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import default_out, environment, print_table, write_result  # noqa: E402

from gpufill.campaign.runner import Campaign  # noqa: E402
from gpufill.campaign.trials import expand  # noqa: E402
from gpufill.data import make_windows  # noqa: E402
from gpufill.forecast import train_forecaster  # noqa: E402
from gpufill.hardware import cpu_count  # noqa: E402
from gpufill.models.classical import train_classical  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sequential(campaign: Campaign) -> tuple[float, dict[str, float]]:
    """Every trial in order in this process; returns (seconds, trial_id -> test MAE)."""
    spec = campaign.spec
    torch.set_num_threads(cpu_count())
    started = time.perf_counter()
    projects = spec.data.load(campaign.base_dir)
    maes = {}
    for trial in expand(spec, list(projects)):
        windows = make_windows(projects[trial.project], trial.lookback, spec.task.horizon, spec.task.split.to_split(), spec.task.stride)
        if trial.kind == "classical":
            run = train_classical(windows, trial.family, trial.params, threads=cpu_count(), seed=trial.seed)
        else:
            run = train_forecaster(windows, trial.family, trial.params, config=spec.train.fit_config(trial.train, trial.seed))
        maes[trial.trial_id] = run.test["mae"]
    return time.perf_counter() - started, maes


def with_gpufill(campaign: Campaign) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    campaign.run(fresh=True)
    seconds = time.perf_counter() - started
    results = campaign.results()
    return seconds, dict(zip(results["trial_id"], results["mae"], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--campaign", type=Path, default=ROOT / "examples" / "demo.yaml")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    env = environment("cpu")
    workdir = Path(tempfile.mkdtemp(prefix="gpufill-bench-"))
    try:
        campaign = Campaign.from_yaml(args.campaign, workdir)
        runs: dict[str, list[float]] = {"sequential": [], "gpufill": []}
        maes: dict[str, dict[str, float]] = {}
        for _ in range(repeats):  # interleaved, so drift in the machine's speed hits both
            seconds, maes["sequential"] = sequential(campaign)
            runs["sequential"].append(seconds)
            seconds, maes["gpufill"] = with_gpufill(campaign)
            runs["gpufill"].append(seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n_trials = len(maes["gpufill"])
    rows = []
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows.append({"loop": name, "trials": n_trials, "seconds": round(median, 2), "trials_per_min": round(60 * n_trials / median, 1), "runs_s": [round(s, 2) for s in seconds]})
    differences = [abs(maes["gpufill"][t] - maes["sequential"][t]) / abs(maes["sequential"][t]) for t in maes["sequential"]]
    ratios = {
        "trials_per_min_gpufill_over_sequential": rows[1]["trials_per_min"] / rows[0]["trials_per_min"],
        "max_relative_mae_difference": max(differences),
        "trials_with_mae_within_1pct": sum(d <= 0.01 for d in differences) / len(differences),
    }
    run_args = {"campaign": str(args.campaign.relative_to(ROOT) if args.campaign.is_relative_to(ROOT) else args.campaign), "repeats": repeats, "quick": args.quick, "cores": cpu_count()}
    print_table("campaign_cpu: demo campaign, sequential loop vs gpufill", rows, ratios, env)
    out = args.out or default_out("campaign_cpu", env)
    write_result(out, env, run_args, rows, ratios)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
