"""Where a quantile network's bands sit among its quantiles.

A network trained with `loss: quantile` gives `len(QUANTILES)` outputs per horizon step, side by side (engine/losses.py:
`quantile_loss`); everything that reads one forecast per step (the metrics, an ensemble's combination, the report)
reads the median (forecasting/task.py: `point_and_quantiles`), and the quantiles are kept beside it (the store's
`quantiles` column), where the intervals at the levels they bound are built from them (campaign/future/intervals.py).
numpy only: the results read these without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpufill.engine.losses import QUANTILES

MEDIAN = QUANTILES.index(0.5)


def band_of(level: float) -> tuple[int, int] | None:
    """The indices in QUANTILES of the central `level` % interval's bounds, None where the quantiles do not hold them."""
    low, high = round(0.5 - level / 200, 6), round(0.5 + level / 200, 6)
    if low in QUANTILES and high in QUANTILES:
        return QUANTILES.index(low), QUANTILES.index(high)
    return None


def band_at(quantiles: np.ndarray | None, level: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) of the central `level` % interval from quantiles (..., Q); None where there are none, or where
    they do not bound that level."""
    index = band_of(level) if quantiles is not None else None
    if index is None or quantiles is None:
        return None
    quantiles = np.asarray(quantiles, dtype=np.float64)
    return quantiles[..., index[0]], quantiles[..., index[1]]


def band_offsets(quantiles: np.ndarray | None, point: np.ndarray, levels: Sequence[float]) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """Per level the quantiles bound, (lower - point, upper - point): a band as offsets from its point forecast, what
    a calibration moves (campaign/future/intervals.py: `calibrate`'s `bands`)."""
    bounded = {level: band_at(quantiles, level) for level in levels}
    return {level: (b[0] - point, b[1] - point) for level, b in bounded.items() if b is not None}


def banded_levels(levels: Sequence[float]) -> set[float]:
    """The levels a quantile network's own band bounds."""
    return {level for level in levels if band_of(level) is not None}
