"""`mode: global`: one model trained on every project's windows, scored on each project's test split.

Each project keeps its own scaling (fitted on its own training part), so windows from
projects of different levels share one model; metrics are computed per project in its
original scale and averaged (the per-project values are kept in the result).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpufill.forecasting.data import WindowedProject
from gpufill.forecasting.data.scoring import per_origin, score
from gpufill.errors import InputError
from gpufill.forecasting.models import registry

METRIC_KEYS = ("mae", "rmse", "smape", "mase")


def run_global(windows: Sequence[WindowedProject], trial: dict[str, Any], spec: Any, *, threads: int, device: str) -> dict[str, Any]:
    widths = {w.n_features for w in windows}
    if len(widths) != 1:
        raise InputError(
            f"projects have different feature counts {sorted(widths)}",
            where=spec.path and str(spec.path), field="task.mode",
            fix="use mode: local, or give every project the same covariate columns",
        )
    train_x = torch.cat([w.x_train for w in windows])
    train_y = torch.cat([w.y_train for w in windows])
    val_x = torch.cat([w.x_val for w in windows])
    val_y = torch.cat([w.y_val for w in windows])
    first = windows[0]
    if trial["kind"] == "classical":
        predictions, plan, timings, history, events, status = _classical(first, trial, train_x, train_y, val_x, val_y, windows, threads)
    else:
        predictions, plan, timings, history, events, status = _neural(first, trial, spec, train_x, train_y, val_x, val_y, windows, device, threads)
    per_project, forecasts = {}, {}
    for w, prediction in zip(windows, predictions, strict=True):
        test, naive, forecasts[w.name] = score(w, prediction)
        per_project[w.name] = {"test": test, "naive": naive, **per_origin(forecasts[w.name])}
    average = {
        part: {key: statistics.fmean(scores[part][key] for scores in per_project.values()) for key in METRIC_KEYS}
        for part in ("test", "naive")
    }
    return {
        "project": "*",
        "family": trial["family"],
        "params": trial["params"],
        "status": status,
        "plan": plan,
        "metrics": {**average, "per_project": per_project},
        "timings": timings,
        "history": history,
        "events": events,
        "forecasts": forecasts,
    }


def _neural(first, trial, spec, train_x, train_y, val_x, val_y, windows, device, threads):
    from gpufill.engine.loop import fit
    from gpufill.forecasting.task import predict

    config = spec.fit_config(trial["family"], trial["train"], trial["seed"], device=device, threads=threads)
    torch.manual_seed(trial["seed"])
    model = registry.build(trial["family"], n_features=first.n_features, lookback=first.lookback, horizon=first.horizon, params=trial["params"])
    result = fit(model, (train_x, train_y), (val_x, val_y) if val_x.shape[0] else None, config=config)
    predictions = [w.inverse_target(predict(result.model, w.x_test, dtype=result.plan.autocast_dtype)) for w in windows]
    history = result.to_dict()["history"]
    return predictions, result.plan.to_dict(), dict(result.timings), history, result.events, result.status


def _classical(first, trial, train_x, train_y, val_x, val_y, windows, threads):
    from gpufill.forecasting.models.classical import SeriesForecaster, classical_plan, fit_and_forecast

    model = registry.build(trial["family"], n_features=first.n_features, lookback=first.lookback, horizon=first.horizon, params=trial["params"])
    if isinstance(model, SeriesForecaster):  # a statistical reference is a model of one series: fitted per project in either mode
        predictions, fit_s, predict_s = [], 0.0, 0.0
        for w in windows:
            model = registry.build(trial["family"], n_features=w.n_features, lookback=w.lookback, horizon=w.horizon, params=trial["params"])
            prediction, spent = fit_and_forecast(model, w, threads=threads, seed=trial["seed"])
            predictions.append(prediction)
            fit_s, predict_s = fit_s + spent["fit_s"], predict_s + spent["predict_s"]
        points = sum(w.fit_end for w in windows)
        return predictions, classical_plan(threads), {"fit_s": fit_s, "predict_s": predict_s, "samples_per_s": points / fit_s if fit_s > 0 else 0.0}, [], [], "completed"
    # No epochs to validate: the validation windows are training data for classical models.
    x = torch.cat([train_x, val_x]).numpy()
    y = torch.cat([train_y, val_y]).numpy()
    tick = time.perf_counter()
    model.fit(x, y, threads=threads, seed=trial["seed"])
    fit_s = time.perf_counter() - tick
    tick = time.perf_counter()
    predictions = [w.inverse_target(np.asarray(model.predict(w.x_test.numpy()))) for w in windows]
    timings = {"fit_s": fit_s, "predict_s": time.perf_counter() - tick, "samples_per_s": x.shape[0] / fit_s if fit_s > 0 else 0.0}
    return predictions, classical_plan(threads), timings, [], [], "completed"
