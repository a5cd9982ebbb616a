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
