"""Forecast metrics on the original scale. Accept numpy arrays or torch tensors, return floats."""

from __future__ import annotations

import numpy as np
import torch

from gpufill.errors import InputError

ArrayLike = np.ndarray | torch.Tensor


def _pair(y_true: ArrayLike, y_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    def as_array(values: ArrayLike) -> np.ndarray:
        if isinstance(values, torch.Tensor):
            values = values.detach().to("cpu", torch.float64).numpy()
        return np.asarray(values, dtype=np.float64)

    true, pred = as_array(y_true), as_array(y_pred)
    if true.shape != pred.shape:
        raise InputError(
            f"y_true has shape {true.shape} but y_pred has shape {pred.shape}",
            fix="pass predictions with the same shape as the truth (N, horizon)",
            where="metrics",
            field="y_pred",
        )
    if true.size == 0:
        raise InputError("no values to score", fix="pass at least one prediction", where="metrics", field="y_true")
    return true, pred


def mae(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    true, pred = _pair(y_true, y_pred)
    return float(np.mean(np.abs(true - pred)))


def rmse(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    true, pred = _pair(y_true, y_pred)
    errors = np.abs(true - pred)
    top = float(errors.max())
    if not 0 < top < np.inf:  # all exact (0), or a non-finite error (inf/nan: the trial fails on it)
        return top
    # Scaled by the largest error: squares of errors near 1e-300 would underflow to 0 (and near 1e200 overflow).
    return float(top * np.sqrt(np.mean((errors / top) ** 2)))


def smape(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Symmetric MAPE in percent (0..200): mean(200 |y - ŷ| / (|y| + |ŷ|)); 0/0 terms count as 0."""
    true, pred = _pair(y_true, y_pred)
    denom = np.abs(true) + np.abs(pred)
    terms = np.divide(200.0 * np.abs(true - pred), denom, out=np.zeros_like(denom), where=denom > 0)
    return float(np.mean(terms))


def mase(y_true: ArrayLike, y_pred: ArrayLike, scale: float) -> float:
    """MAE divided by ``scale`` (the in-sample naive MAE of the train region)."""
    if not np.isfinite(scale) or scale <= 0:
        raise InputError(
            f"scale must be a positive finite number, got {scale!r}",
            fix="pass WindowedProject.mase_scale (mean |y_t - y_(t-1)| over the train region)",
            where="metrics",
            field="mase_scale",
        )
    return mae(y_true, y_pred) / float(scale)


def forecast_metrics(y_true: ArrayLike, y_pred: ArrayLike, mase_scale: float) -> dict[str, float]:
    """Every metric a trial is scored by: keys exactly forecasting.trial.METRICS, in that order."""
    return {
        "mae": mae(y_true, y_pred),
        "rmse": rmse(y_true, y_pred),
        "smape": smape(y_true, y_pred),
        "mase": mase(y_true, y_pred, mase_scale),
    }


def mean_over_series(prediction: np.ndarray, truth: np.ndarray, series: np.ndarray, metric: str, scales: np.ndarray | None = None) -> np.ndarray:
    """`metric` of forecasts of many series at once, as a global trial is scored: per series over its rows, then the
    mean over series. `prediction` (..., N, H) against `truth` (N, H); row n is of series `series[n]` (0..G-1);
    `scales` (G,): each series' MASE scale. Returns one score per leading index (a float array of shape ...): what
    a pruner asks after each epoch and forward selection asks of every candidate combination, so it is vectorised."""
    if metric not in ("mae", "rmse", "smape", "mase") or (metric == "mase" and scales is None):
        raise ValueError(f"unknown metric {metric!r}, or mase without the series' scales")
    prediction = np.asarray(prediction, dtype=np.float64)
    errors = np.abs(prediction - truth)
    if metric == "smape":
        denominator = np.abs(prediction) + np.abs(truth)
        rows = np.divide(200.0 * errors, denominator, out=np.zeros_like(errors), where=denominator > 0).mean(axis=-1)
    elif metric == "rmse":
        rows = (errors**2).mean(axis=-1)
    else:
        rows = errors.mean(axis=-1)
    lead = rows.shape[:-1]
    rows = rows.reshape(-1, rows.shape[-1])
    groups = int(series.max()) + 1
    keys = (np.arange(rows.shape[0])[:, None] * groups + series).ravel()
    per_series = np.bincount(keys, weights=rows.ravel(), minlength=rows.shape[0] * groups).reshape(-1, groups) / np.bincount(series, minlength=groups)
    if metric == "rmse":
        per_series = np.sqrt(per_series)
    elif metric == "mase":
        per_series = per_series / np.asarray(scales, dtype=np.float64)
    return per_series.mean(axis=1).reshape(lead)
