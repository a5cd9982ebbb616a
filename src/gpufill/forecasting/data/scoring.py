"""A trial's test forecasts scored, and kept: every family (neural, fused, classical, statistical,
global) goes through `score`, so metrics and the stored forecasts always describe the same numbers.

The forecast kept per project: the test windows' origins, the forecasts and the actual values
((N, horizon), float32 precision; the store keeps them as bytes), a quantile network's quantiles ((N, horizon, Q)) and
the MASE scale; enough to export them, plot them, bound them and score ensembles of several trials without reading the
data again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufill.forecasting.data.metrics import forecast_metrics, mean_metrics
from gpufill.forecasting.data.windows import WindowedProject

__all__ = ["Scored", "ValidationScored", "per_origin", "score", "score_validation"]

Scored = tuple[dict[str, float], dict[str, float], dict[str, Any]]
"""(test metrics, the last-value forecast's metrics on the same windows, the forecast kept)."""
ValidationScored = tuple[dict[str, float], dict[str, Any]]
"""(validation metrics, the validation forecast kept: origins, forecast and truth as `score` keeps the test's)."""


def score(windows: WindowedProject, prediction: np.ndarray, quantiles: np.ndarray | None = None) -> Scored:
    """`prediction` (N_test, horizon) in the original scale; `quantiles` (N_test, horizon, Q), a quantile network's,
    kept beside it. A backtest's metrics are the mean over its origins of each origin's metrics (kept as `per_origin`);
    otherwise every test value weighs the same."""
    prediction = np.asarray(prediction, dtype=np.float64)
    # Plain lists: a result stays JSON (gpufill train --json); the store keeps them as float32 bytes.
    kept: dict[str, Any] = {"origins": windows.test_origins.tolist(), "forecast": prediction.astype(np.float32).tolist(),
                            "truth": windows.test_truth.astype(np.float32).tolist(), "mase_scale": float(windows.mase_scale),
                            **_quantiles(quantiles)}
    if not windows.backtest:
        return (forecast_metrics(windows.test_truth, prediction, windows.mase_scale),
                forecast_metrics(windows.test_truth, windows.naive_test, windows.mase_scale), kept)
    per_origin = [{"origin": int(origin), **forecast_metrics(windows.test_truth[i : i + 1], prediction[i : i + 1], windows.mase_scale)}
                  for i, origin in enumerate(windows.test_origins)]
    naive = [forecast_metrics(windows.test_truth[i : i + 1], windows.naive_test[i : i + 1], windows.mase_scale) for i in range(len(per_origin))]
    kept["per_origin"] = per_origin
    return mean_metrics(per_origin), mean_metrics(naive), kept


def score_validation(windows: WindowedProject, prediction: np.ndarray, quantiles: np.ndarray | None = None) -> ValidationScored | None:
    """The metrics of `prediction` (N_val, horizon), original scale, against the validation windows' targets, and the
    forecast kept (what an ensemble's own validation score, and an interval's calibration, are computed from; a
    quantile network's `quantiles` beside it); None without validation windows: what a choice between configurations
    reads, never the test split."""
    if not windows.x_val.shape[0]:
        return None
    prediction = np.asarray(prediction, dtype=np.float64)
    truth = windows.val_truth()
    kept = {"origins": np.asarray(windows.val_origins).tolist(), "forecast": prediction.astype(np.float32).tolist(),
            "truth": np.asarray(truth, dtype=np.float32).tolist(), **_quantiles(quantiles)}
    return forecast_metrics(truth, prediction, windows.mase_scale), kept


def _quantiles(quantiles: np.ndarray | None) -> dict[str, Any]:
    return {} if quantiles is None else {"quantiles": np.asarray(quantiles, dtype=np.float32).tolist()}


def per_origin(kept: dict[str, Any] | None) -> dict[str, Any]:
    """{"per_origin": [...]} for a backtest's metrics (each origin's), else nothing."""
    return {"per_origin": kept["per_origin"]} if kept and "per_origin" in kept else {}
