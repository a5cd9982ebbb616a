"""Every metric a trial is scored by, in one registry: add a metric here (and to its test), and the store's columns,
`results` and its tables, the report, MLflow's export and `task.metric` follow.

A `Metric` has its name (a store column, `results`' column and `val_` column, MLflow's metric, a `task.metric` value),
its label in tables and reports, and how it scores: a whole forecast at once (`score`: truth, forecast, the series'
MASE scale), and many forecasts of many series at once (`rows` per forecast row, then `finish` over each series' mean
of rows: what forward selection and pruners ask, vectorised; `forecasting/data/metrics.py: mean_over_series`).
Importing this imports no numpy: `gpufill status` and `results` read the names without it; each function imports
what it uses when it is called. Every metric is an error: lower is better (results rank so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufill.errors import InputError

__all__ = ["METRICS", "Metric", "Metrics", "mae", "mase", "rmse", "smape"]


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    label: str
    score: Callable[[Any, Any, float], float]
    """(truth, forecast, MASE scale) -> the metric over every value (numpy arrays or torch tensors of one shape)."""
    rows: Callable[[Any, Any], Any]
    """(forecasts (..., N, H), truth (N, H)) -> (..., N): each row's contribution, averaged per series."""
    finish: Callable[[Any, Any], Any] = lambda per_series, scales: per_series
    """(each series' mean of rows (..., G), the series' MASE scales (G,) or None) -> the metric per series."""
    units: str = "the data's units"
    """What a value of it is measured in, for axis labels: a scale-free metric's pools across series, a raw one's does not."""


class Metrics(Mapping[str, Metric]):
    """The registry: names in the order every table shows them."""

    def __init__(self, metrics: list[Metric]):
        self._by_name = {metric.name: metric for metric in metrics}

    def __getitem__(self, name: str) -> Metric:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def register(self, metric: Metric) -> None:
        """Add `metric` after the others (a name already there is refused)."""
        if metric.name in self._by_name or not metric.name.isidentifier():
            raise ValueError(f"metric {metric.name!r} is registered already or is not a column name")
        self._by_name[metric.name] = metric

    def unregister(self, name: str) -> None:
        del self._by_name[name]


def _pair(y_true: Any, y_pred: Any) -> tuple[Any, Any]:
    """Truth and forecast as float64 numpy arrays of one shape (torch tensors too), at least one value."""
    import numpy as np

    def as_array(values: Any) -> Any:
        if hasattr(values, "detach"):  # a torch tensor
            values = values.detach().cpu().double().numpy()
        return np.asarray(values, dtype=np.float64)

    true, pred = as_array(y_true), as_array(y_pred)
    if true.shape != pred.shape:
        raise InputError(f"y_true has shape {true.shape} but y_pred has shape {pred.shape}",
                         fix="pass predictions with the same shape as the truth (N, horizon)", where="metrics", field="y_pred")
    if true.size == 0:
        raise InputError("no values to score", fix="pass at least one prediction", where="metrics", field="y_true")
    return true, pred


def mae(y_true: Any, y_pred: Any, scale: float | None = None) -> float:
    import numpy as np

    true, pred = _pair(y_true, y_pred)
    return float(np.mean(np.abs(true - pred)))


def rmse(y_true: Any, y_pred: Any, scale: float | None = None) -> float:
    import numpy as np

    true, pred = _pair(y_true, y_pred)
    errors = np.abs(true - pred)
    top = float(errors.max())
    if not 0 < top < np.inf:  # all exact (0), or a non-finite error (inf/nan: the trial fails on it)
        return top
    # Scaled by the largest error: squares of errors near 1e-300 would underflow to 0 (and near 1e200 overflow).
    return float(top * np.sqrt(np.mean((errors / top) ** 2)))


def smape(y_true: Any, y_pred: Any, scale: float | None = None) -> float:
    """Symmetric MAPE in percent (0..200): mean(200 |y - ŷ| / (|y| + |ŷ|)); 0/0 terms count as 0."""
    import numpy as np

    true, pred = _pair(y_true, y_pred)
    denom = np.abs(true) + np.abs(pred)
    terms = np.divide(200.0 * np.abs(true - pred), denom, out=np.zeros_like(denom), where=denom > 0)
    return float(np.mean(terms))


def mase(y_true: Any, y_pred: Any, scale: float | None) -> float:
    """MAE divided by ``scale`` (the in-sample naive MAE of the train region)."""
    import math

    if scale is None or not math.isfinite(scale) or scale <= 0:
        raise InputError(f"scale must be a positive finite number, got {scale!r}",
                         fix="pass WindowedProject.mase_scale (mean |y_t - y_(t-1)| over the train region)", where="metrics", field="mase_scale")
    return mae(y_true, y_pred) / float(scale)


def _abs_errors(forecasts: Any, truth: Any) -> Any:
    import numpy as np

    return np.abs(np.asarray(forecasts, dtype=np.float64) - truth)


def _smape_rows(forecasts: Any, truth: Any) -> Any:
    import numpy as np

    forecasts = np.asarray(forecasts, dtype=np.float64)
    errors = np.abs(forecasts - truth)
    denominator = np.abs(forecasts) + np.abs(truth)
    return np.divide(200.0 * errors, denominator, out=np.zeros_like(errors), where=denominator > 0).mean(axis=-1)


def _by_scale(per_series: Any, scales: Any) -> Any:
    import numpy as np

    if scales is None:
        raise ValueError("mase needs each series' scale")
    return per_series / np.asarray(scales, dtype=np.float64)


METRICS = Metrics([
    Metric("mae", "MAE", mae, lambda f, t: _abs_errors(f, t).mean(axis=-1)),
    Metric("rmse", "RMSE", rmse, lambda f, t: (_abs_errors(f, t) ** 2).mean(axis=-1), lambda per_series, scales: per_series**0.5),
    Metric("smape", "sMAPE", smape, _smape_rows, units="percent, 0-200"),
    Metric("mase", "MASE", mase, lambda f, t: _abs_errors(f, t).mean(axis=-1), _by_scale, units="in-sample naive errors"),
])
"""What every trial is scored by, on its test split and the naive forecast's: the store keeps a column of each, a
campaign ranks by one of them (task.metric)."""
