"""Prediction intervals by split conformal prediction, and how good intervals are (coverage, MSIS).

A forecast's errors on windows its model never trained on (the validation windows: the campaign's first training
stops on them but never fits them) say how wide an interval must be: at level L the half-width of step h is the
conformal quantile of the absolute errors of step h, the ceil((n + 1) L)-th smallest of n (split conformal, as
mlforecast's and neuralforecast's conformal intervals are). A series with too few windows for the level (19 for 95 %,
4 for 80 %: a competition's validation part is often one window) borrows from every series of the campaign: the
errors are pooled as multiples of each series' scale (its MASE scale) and the quantile scaled back to the series.

A quantile network's forecast has its own band at the levels its quantiles bound (engine/losses.py: QUANTILES): there
the validation windows say how far to move the band, not how wide to make it around the point (conformalized quantile
regression: `calibrate`'s `bands`); the band keeps what the network learned of each window's spread.

Scores: `coverage` (the share of actual values inside) and `msis`, M4's mean scaled interval score: the interval's
width plus 2 / alpha times how far an actual value falls outside, over the series' scale (lower is better).
numpy only: the results, the report and the export read these without torch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpufill.forecasting.data.quantiles import band_at

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
    banded: frozenset[float] = frozenset()
    """Levels whose widths move the forecast's own quantile band outwards (inwards where negative), not the point's."""

    def bounds(self, forecast: np.ndarray, level: float, band: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) around `forecast` (..., horizon) at `level`; of a banded level, the forecast's own quantile
        `band` (lower, upper) moved by the width, never past the point forecast."""
        width = self.half_widths[level][: np.shape(forecast)[-1]]
        if level in self.banded and band is not None:
            return np.minimum(band[0] - width, forecast), np.maximum(band[1] + width, forecast)
        return forecast - width, forecast + width

    def intervals(self, forecast: np.ndarray, levels: Sequence[float], quantiles: np.ndarray | None = None
                  ) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """(lower, upper) at each of `levels`, nested; `quantiles` (..., Q): a quantile forecast's own, whose band
        each banded level moves."""
        return nested({level: self.bounds(forecast, level, band_at(quantiles, level)) for level in levels})

    @property
    def described(self) -> str:
        """Where the intervals came from, as a forecast's `interval_from` says it."""
        return self.source + (" (quantiles)" if self.banded else "")


def calibrate(errors: Mapping[str, np.ndarray], scales: Mapping[str, float], levels: Sequence[float] = LEVELS,
              bands: Mapping[str, Mapping[float, tuple[np.ndarray, np.ndarray]]] | None = None,
              banded: Mapping[str, Collection[float]] | None = None) -> dict[str, Calibration]:
    """Per series, the half-widths of each level from its validation forecasts' errors (series -> (windows, horizon)
    actual minus forecast); a series with fewer windows than the widest level needs, from the pooled scaled errors.

    `bands`: per series and level, a quantile forecast's bounds on the same windows, as offsets from the point forecast
    (lower - point, upper - point). There the score of a window is how far the actual value falls outside the band
    (negative inside): max(lower - actual, actual - upper), and its conformal quantile moves both bounds (conformalized
    quantile regression, Romano et al. 2019): the band keeps its shape, wider where the series is harder, and its
    level holds as split conformal's does. A band's scores pool only with other bands'. `banded`: per series, the
    levels its forecast has its own band at (default: those of `bands`), so that a series without validation windows
    of its own borrows from the bands' pool where its forecast is a band."""
    bands = bands or {}
    kinds = {name: set(levels_) for name, levels_ in (banded if banded is not None else {}).items()}
    for name, given in bands.items():
        kinds.setdefault(name, set()).update(given)
    needed = max(windows_needed(level) for level in levels)
    usable = {name: np.asarray(e, dtype=np.float64) for name, e in errors.items() if np.size(e)}
    scores = {level: {name: _score(e, bands.get(name, {}).get(level)) for name, e in usable.items()} for level in levels}
    pools: dict[tuple[float, bool], tuple[np.ndarray, int] | None] = {}

    def pooled(level: float, is_band: bool) -> tuple[np.ndarray, int] | None:
        """(the pooled scores' conformal quantile per step in units of the series' scales, their count), once per kind."""
        if (level, is_band) not in pools:
            parts = [score / scales[other] for other, score in scores[level].items()
                     if scales.get(other) and (level in kinds.get(other, ())) == is_band]
            stacked = np.concatenate(parts) if parts else None
            pools[(level, is_band)] = None if stacked is None else (
                np.array([conformal_quantile(stacked[:, h], level) for h in range(stacked.shape[1])]), int(stacked.shape[0]))
        return pools[(level, is_band)]

    out: dict[str, Calibration] = {}
    for name in scales:
        widths, sources, counts = {}, set(), set()
        for level in levels:
            own = scores[level].get(name)
            if own is not None and own.shape[0] >= needed:
                widths[level] = np.array([conformal_quantile(own[:, h], level) for h in range(own.shape[1])])
                sources.add("series")
                counts.add(int(own.shape[0]))
            elif (pool := pooled(level, level in kinds.get(name, ()))) is not None:
                widths[level] = scales[name] * pool[0]
                sources.add("pooled")
                counts.add(pool[1])
        if len(widths) == len(levels):
            out[name] = Calibration(widths, "pooled" if "pooled" in sources else "series", max(counts),
                                    frozenset(level for level in levels if level in kinds.get(name, ())))
    return out


def nested(bounds: Mapping[float, tuple[np.ndarray, np.ndarray]]) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """Each level's (lower, upper) widened to hold every narrower level's: a quantile band moved per level (its 80 %
    and 95 % bounds calibrated apart) may otherwise leave a 95 % bound inside the 80 % one at a step."""
    out: dict[float, tuple[np.ndarray, np.ndarray]] = {}
    inner: tuple[np.ndarray, np.ndarray] | None = None
    for level in sorted(bounds):
        lower, upper = bounds[level]
        if inner is not None:
            lower, upper = np.fmin(lower, inner[0]), np.fmax(upper, inner[1])
        out[level] = inner = (lower, upper)
    return out


def _score(errors: np.ndarray, band: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Split conformal's score of each value: its absolute error around a point, how far it falls outside a band."""
    if band is None:
        return np.abs(errors)
    lower, upper = (np.asarray(b, dtype=np.float64) for b in band)
    return np.maximum(lower - errors, errors - upper)


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
