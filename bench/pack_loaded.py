"""The same fit_many call, again and again, on a machine that other processes keep busy: stable time, stable choice.

    python bench/pack_loaded.py [--smoke] [--runs N] [--busy N] [--k K] [--out PATH]

`--busy` processes spin on the CPU for the whole run (a machine whose load a user does not control). Each run is one
`gpufill.fit_many` call of K seeds of a small MLP (64 -> 32 -> 32 -> 2, 5,000 rows, batch 256, 3 epochs, Adam) with
everything left to `auto` and this process's caches cleared, so every call measures and decides afresh. The table has
each run's wall time and decision; the ratios are the slowest run over the fastest and the share of runs that packed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

import gpufill  # noqa: E402
from gpufill.engine.packs import many  # noqa: E402

SIZES = {"smoke": {"runs": 2, "busy": 1, "k": 4, "rows": 2048, "batch": 128}, "full": {"runs": 10, "busy": 2, "k": 16, "rows": 5000, "batch": 256}}
SPIN = "while True: pass"


def make() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="seconds: K 4, 2 runs, 1 busy process (CI)")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--busy", type=int, default=None)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size = dict(SIZES["smoke" if args.smoke else "full"])
    size.update({key: value for key, value in (("runs", args.runs), ("busy", args.busy), ("k", args.k)) if value is not None})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size["rows"] + 1000, 64, generator=g)
    y = x[:, :2] * 2 - x[:, 2:4] + 0.1 * torch.randn(x.shape[0], 2, generator=g)
    train, val = (x[: size["rows"]], y[: size["rows"]]), (x[size["rows"]:], y[size["rows"]:])
    rows: list[dict[str, Any]] = []
    # The process's own one-time cost, which any script pays with its first optimizer (torch.optim imports
    # torch._dynamo: about 2 s here), before the runs: they compare the same call, not the process's start.
    torch.optim.Adam(nn.Linear(1, 1).parameters())
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(size["busy"])]
    try:
        time.sleep(0.5)  # the spinners are running before the first call
        for run in range(size["runs"]):
            many.clear_caches()
            tick = time.perf_counter()
            results = gpufill.fit_many(make, train, val, variants=[{"seed": s} for s in range(size["k"])], optimizer="adam", loss="mse",
                                       batch_size=size["batch"], epochs=3, lr=5e-3, verbose=False)
            wall = time.perf_counter() - tick
            choice = results[0].plan.pack_size
            timings = results[0].timings
            rows.append({"run": run, "wall_s": round(wall, 3), "pack_size": choice.value, "threads": results[0].plan.threads.value,
                         "measure_s": round(timings.get("probe_s", timings.get("pack_probe_s", 0.0)), 3),
                         "train_s": round(timings.get("pack_train_s", timings.get("train_s", 0.0) * len(results)), 3),
                         "rechecks": sum(e.startswith("threads: ") for e in results[0].events),
                         "val_loss": float(f"{min(r.metrics['val_loss'] for r in results):.5g}"), "choice": choice.reason[:110]})
            print(f"run {run}: {wall:.2f} s, pack {choice.value}: {choice.reason[:100]}", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    walls = [row["wall_s"] for row in rows]
    ratios = {"slowest_over_fastest": round(max(walls) / min(walls), 3), "packed_share": sum(r["pack_size"] == size["k"] for r in rows) / len(rows)}
    finish("pack_loaded", f"fit_many of {size['k']} small MLPs with {size['busy']} busy processes", environment("cpu"), size, rows, ratios, args.out)


if __name__ == "__main__":
    main()
