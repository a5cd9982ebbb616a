"""Forecast metrics on the original scale (the registry: forecasting/metric_registry.py). Accept numpy arrays or torch
tensors, return floats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpufill.forecasting.metric_registry import METRICS, mae, mase, rmse, smape  # the metrics themselves live in the registry

if TYPE_CHECKING:
    import torch

    ArrayLike = np.ndarray | torch.Tensor
else:
    ArrayLike = Any  # no torch import for a type: scoring needs numpy alone

__all__ = ["ArrayLike", "forecast_metrics", "mae", "mase", "mean_metrics", "mean_over_series", "rmse", "smape"]


def forecast_metrics(y_true: ArrayLike, y_pred: ArrayLike, mase_scale: float) -> dict[str, float]:
    """Every metric a trial is scored by (forecasting/metric_registry.py: METRICS), in its order."""
    return {name: float(metric.score(y_true, y_pred, mase_scale)) for name, metric in METRICS.items()}


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over `rows` (a backtest's origins, each scored by `forecast_metrics`)."""
    return {name: float(np.mean([row[name] for row in rows])) for name in METRICS}


def mean_over_series(prediction: np.ndarray, truth: np.ndarray, series: np.ndarray, metric: str, scales: np.ndarray | None = None) -> np.ndarray:
    """`metric` of forecasts of many series at once, as a global trial is scored: per series over its rows, then the
    mean over series. `prediction` (..., N, H) against `truth` (N, H); row n is of series `series[n]` (0..G-1);
    `scales` (G,): each series' MASE scale. Returns one score per leading index (a float array of shape ...): what
    a pruner asks after each epoch and forward selection asks of every candidate combination, so it is vectorised."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")
    kind = METRICS[metric]
    rows = kind.rows(prediction, truth)
    lead = rows.shape[:-1]
    rows = rows.reshape(-1, rows.shape[-1])
    groups = int(series.max()) + 1
    keys = (np.arange(rows.shape[0])[:, None] * groups + series).ravel()
    per_series = np.bincount(keys, weights=rows.ravel(), minlength=rows.shape[0] * groups).reshape(-1, groups) / np.bincount(series, minlength=groups)
    return kind.finish(per_series, scales).mean(axis=1).reshape(lead)
