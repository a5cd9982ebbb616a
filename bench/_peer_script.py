"""A neuralforecast user's whole script, as bench/peer_speed.py runs it in a process of its own: import neuralforecast,
read the histories from a CSV (unique_id, y), fit the peer at its documented defaults and predict the horizon
(bench/_peer_neuralforecast.py: the same settings as every other peer arm), write the forecasts as JSON.

    python bench/_peer_script.py --data HISTORIES.csv --horizon H --out OUT.json [--peer nbeats] [--seed 1] [--threads N] [--max-steps N]

The JSON also holds the fit + predict seconds and the wall clock at their start and end, so the caller has both the
whole process (its own clock around this script) and the part a benchmark inside one process would time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--horizon", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peer", default="nbeats")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default, every core)")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--together", type=Path, default=None, help="a folder where N scripts started at once meet before their fits")
    parser.add_argument("--of", type=int, default=1, help="with --together: how many scripts meet")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # before neuralforecast sizes anything
    import pandas as pd

    sys.path.insert(0, str(Path(__file__).parent))
    from _peer_neuralforecast import model_class, peer_forecasts

    model_class(args.peer)  # neuralforecast's import (Lightning's: most of the script's seconds) before the fit's clock
    frame = pd.read_csv(args.data, dtype={"unique_id": str})
    histories = {key: part["y"].to_numpy(float) for key, part in frame.groupby("unique_id", sort=False)}
    if args.together is not None:  # the fits start at once, so their span is theirs, not the imports' stagger
        meet(args.together, args.seed, args.of)
    started = time.time()
    forecasts, seconds, changed = peer_forecasts(histories, args.horizon, args.peer, max_steps=args.max_steps, seed=args.seed)
    args.out.write_text(json.dumps({"forecasts": {key: values.tolist() for key, values in forecasts.items()}, "seconds": seconds,
                                    "started": started, "ended": time.time(), "changed": changed}))


def meet(folder: Path, seed: int, of: int, timeout_s: float = 900.0) -> None:
    """Wait until `of` scripts have each left a mark in `folder` (a loaded box: its own generous timeout)."""
    (folder / f"{seed}.ready").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob("*.ready"))) < of:
        if time.monotonic() > deadline:
            raise SystemExit(f"the other scripts did not reach {folder} within {timeout_s:.0f} s")
        time.sleep(0.01)


if __name__ == "__main__":
    main()
