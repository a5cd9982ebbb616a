"""Prediction intervals by split conformal prediction, and how good intervals are (coverage, MSIS).

A forecast's errors on windows its model never trained on (the validation windows: the campaign's first training
stops on them but never fits them) say how wide an interval must be: at level L the half-width of step h is the
conformal quantile of the absolute errors of step h, the ceil((n + 1) L)-th smallest of n (split conformal, as
mlforecast's and neuralforecast's conformal intervals are). A series with too few windows for the level (19 for 95 %,
4 for 80 %: a competition's validation part is often one window) borrows from every series of the campaign: the
errors are pooled as multiples of each series' scale (its MASE scale) and the quantile scaled back to the series.

Scores: `coverage` (the share of actual values inside) and `msis`, M4's mean scaled interval score: the interval's
width plus 2 / alpha times how far an actual value falls outside, over the series' scale (lower is better).
numpy only: the results, the report and the export read these without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LEVELS = (80, 95)
"""The intervals a forecast gets unless asked otherwise (statsforecast's and neuralforecast's habit)."""


def windows_needed(level: float) -> int:
    """The fewest errors whose conformal quantile at `level` (percent) is finite: ceil((n + 1) L) <= n."""
    alpha = 1 - level / 100
    return max(1, math.ceil(1 / alpha - 1 - 1e-9))


def conformal_quantile(errors: np.ndarray, level: float) -> float:
    """The ceil((n + 1) L)-th smallest of `errors` (inf where there are too few for `level`)."""
    errors = np.sort(np.asarray(errors, dtype=np.float64).ravel())
    rank = math.ceil((errors.size + 1) * level / 100 - 1e-9)
    return float(errors[rank - 1]) if 1 <= rank <= errors.size else math.inf


@dataclass(frozen=True, slots=True)
class Calibration:
    """One series' interval half-widths: level -> (horizon,), and what they were computed from."""

    half_widths: dict[float, np.ndarray]
    source: str
    """"series": its own validation windows; "pooled": every series' errors in units of their scales."""
    windows: int
    """Validation windows behind it (the series' own, or all series' where pooled)."""

    def bounds(self, forecast: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) around `forecast` (..., horizon) at `level`."""
        width = self.half_widths[level][: np.shape(forecast)[-1]]
        return forecast - width, forecast + width


def calibrate(errors: Mapping[str, np.ndarray], scales: Mapping[str, float], levels: Sequence[float] = LEVELS) -> dict[str, Calibration]:
    """Per series, the half-widths of each level from its validation forecasts' errors (series -> (windows, horizon)
    actual minus forecast); a series with fewer windows than the widest level needs, from the pooled scaled errors."""
    needed = max(windows_needed(level) for level in levels)
    usable = {name: np.abs(np.asarray(e, dtype=np.float64)) for name, e in errors.items() if np.size(e)}
    pooled = [e / scales[name] for name, e in usable.items() if scales.get(name)]
    stacked = np.concatenate(pooled) if pooled else None
    out: dict[str, Calibration] = {}
    for name in scales:
        own = usable.get(name)
        if own is not None and own.shape[0] >= needed:
            widths = {level: np.array([conformal_quantile(own[:, h], level) for h in range(own.shape[1])]) for level in levels}
            out[name] = Calibration(widths, "series", int(own.shape[0]))
        elif stacked is not None:
            widths = {level: scales[name] * np.array([conformal_quantile(stacked[:, h], level) for h in range(stacked.shape[1])]) for level in levels}
            out[name] = Calibration(widths, "pooled", int(stacked.shape[0]))
    return out


def coverage(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The share of actual values inside [lower, upper]."""
    truth = np.asarray(truth, dtype=np.float64)
    return float(np.mean((truth >= lower) & (truth <= upper)))


def msis(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray, level: float, scale: float) -> float:
    """M4's mean scaled interval score at `level`: the mean over values of the width plus 2 / alpha times the miss,
    over `scale` (gpufill's MASE scale: the mean absolute one-step change in the training part)."""
    truth = np.asarray(truth, dtype=np.float64)
    alpha = 1 - level / 100
    score = (upper - lower) + 2 / alpha * (lower - truth) * (truth < lower) + 2 / alpha * (truth - upper) * (truth > upper)
    return float(np.mean(score) / scale)
