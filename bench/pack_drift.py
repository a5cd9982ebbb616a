"""Packed campaign trials against the same trials trained alone: per-trial test metrics.

    python bench/pack_drift.py [--smoke | --quick] [--families mlp,gru] [--out PATH]

One campaign file (synthetic projects x families x seeds, AdamW with weight decay 0.01, early
stopping on validation, the demo's settings otherwise) run twice in this process: with
`resources.pack_size` set so that every shape trains in packs, and with `pack_size: 1` (each
trial alone through `fit`). Each trial's test MAE, RMSE and sMAPE are matched by trial id; reported per family: the largest and
the median relative difference, how many trials kept a different best epoch, and the time of
each run. A packed trial equals its solo training when the pack's forward, backward and AdamW
arithmetic equal the model's alone: the differences left are float rounding, amplified where
early stopping flips at its threshold. On a CPU torch is pinned to one thread.

Sizes: --smoke 4 trials (2 projects x mlp x 2 seeds, 2 epochs: seconds, CI); --quick 16 trials
(4 projects x 2 families x 2 seeds); the default 64 (16 projects x 2 families x 2 seeds).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.campaign import Campaign  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402

SIZES = {"smoke": (2, ("mlp",), 2, 2), "quick": (4, ("mlp", "gru"), 2, 20), "full": (16, ("mlp", "gru"), 2, 20)}
"""projects, families, seeds, epochs"""
SHAPES = {"mlp": "{hidden_size: 32}", "gru": "{hidden_size: 16}", "lstm": "{hidden_size: 16}", "tcn": "{channels: 16}",
          "transformer": "{d_model: 16, nhead: 2, num_layers: 1}"}
METRICS = ("mae", "rmse", "smape")


def write_campaign(folder: Path, name: str, projects: int, families: tuple[str, ...], seeds: int, epochs: int, pack_size: int) -> Path:
    models = "\n".join(f"  {family}: {SHAPES[family]}" for family in families)
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f"data: {{source: synthetic, projects: {projects}, length: 400, seed: 0}}\n"
        "task: {lookback: [12], horizon: 1, split: {val: 0.15, test: 0.2}}\n"
        f"models:\n{models}\n"
        f"train: {{epochs: {epochs}, weight_decay: 0.01, early_stopping: {{patience: 3}}}}\n"
        f"seeds: {list(range(seeds))}\n"
        f"resources: {{retries: 0, pack_size: {pack_size}, gpu_slots: 1, cpu_slots: 1}}\n"
    )
    return path


def run(folder: Path, name: str, size: tuple[Any, ...], pack_size: int) -> tuple[Any, float]:
    """The run's results table with each trial's pack size and best epoch (from its stored plan and metrics), and its seconds."""
    projects, families, seeds, epochs = size
    path = write_campaign(folder, name, projects, families, seeds, epochs, pack_size)
    tick = time.perf_counter()
    Campaign.from_yaml(path, folder / name).run()
    seconds = time.perf_counter() - tick
    table = Campaign.from_yaml(path, folder / name).results()
    with sqlite3.connect(folder / name / "gpufill.db") as con:
        stored = {trial: (json.loads(plan or "{}"), json.loads(metrics or "{}")) for trial, plan, metrics in
                  con.execute("SELECT trial_id, plan, metrics FROM trials")}
    table["pack_size"] = [stored[t][0].get("pack_size", {}).get("value", 1) for t in table["trial_id"]]
    table["best_epoch"] = [stored[t][1].get("best_epoch") for t in table["trial_id"]]
    return table, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--smoke", action="store_true", help="4 trials, 2 epochs: seconds (CI)")
    group.add_argument("--quick", action="store_true", help="16 trials")
    parser.add_argument("--families", default=None, help="default mlp,gru (--smoke mlp)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    projects, families, seeds, epochs = SIZES[size_name]
    if args.families:
        families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    torch.set_num_threads(1)
    size = (projects, families, seeds, epochs)
    pack = projects * seeds  # every trial of a family's shape in one pack
    with tempfile.TemporaryDirectory() as folder:
        packed, packed_s = run(Path(folder), "packed", size, pack)
        alone, alone_s = run(Path(folder), "alone", size, 1)
    packed, alone = packed.set_index("trial_id"), alone.set_index("trial_id")
    if set(packed.index) != set(alone.index) or not (packed["status"] == "done").all() or not (alone["status"] == "done").all():
        raise SystemExit("the two runs did not finish the same trials")
    alone = alone.loc[packed.index]
    if (alone["pack_size"] > 1).any() or not (packed["pack_size"] > 1).any():
        raise SystemExit("the packed run trained nothing in a pack, or the solo run packed")
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for family in families:
        mine = packed[packed["family"] == family]
        theirs = alone.loc[mine.index]
        row: dict[str, Any] = {"family": family, "trials": len(mine)}
        for metric in METRICS:
            rel = ((mine[metric] - theirs[metric]).abs() / theirs[metric].abs()).tolist()
            row[f"{metric}_max_rel_diff"] = float(f"{max(rel):.3g}")
            row[f"{metric}_median_rel_diff"] = float(f"{statistics.median(rel):.3g}")
            ratios[f"{family}:{metric}_max_rel_diff"] = max(rel)
        row["other_best_epoch"] = int((mine["best_epoch"].to_numpy() != theirs["best_epoch"].to_numpy()).sum())
        row["pack_sizes"] = ",".join(str(p) for p in sorted(set(mine["pack_size"])))
        ratios[f"{family}:packed_trials"] = float((mine["pack_size"] > 1).sum())
        rows.append(row)
    ratios["packed_run_s"], ratios["alone_run_s"] = packed_s, alone_s
    ratios["max_rel_diff_all"] = max(v for k, v in ratios.items() if k.endswith("max_rel_diff"))
    finish("pack_drift", f"{len(packed)} campaign trials packed vs trained alone (test metrics)", environment(str(resolve_device("auto"))),
           {"size": size_name, "projects": projects, "families": list(families), "seeds": seeds, "epochs": epochs, "pack_size": pack,
            "threads": 1}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
