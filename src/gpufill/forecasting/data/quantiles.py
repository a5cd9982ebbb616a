"""A quantile network's outputs read as a forecast: the median is its point forecast, the other quantiles its bands.

A network trained with `loss: quantile` gives `len(QUANTILES)` outputs per horizon step, side by side (engine/losses.py:
`quantile_loss`); everything that reads one forecast per step (the metrics, an ensemble's combination, the report)
reads the median, and the quantiles are kept beside it (the store's `quantiles` column), where the intervals at the
levels they bound are built from them (campaign/future/intervals.py). numpy only: the results read these without torch.
"""

from __future__ import annotations

import numpy as np

from gpufill.engine.losses import QUANTILES

MEDIAN = QUANTILES.index(0.5)


def point_and_quantiles(output: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(point forecast (N, horizon), quantiles (N, horizon, Q) or None) of a network's outputs (N, horizon) or
    (N, horizon x Q): a quantile network's quantiles in order (a crossing pair of learned quantiles sorted:
    rearrangement, Chernozhukov et al. 2010, which never makes them worse) and their median its point forecast."""
    output = np.asarray(output)
    if output.shape[-1] == horizon:
        return output, None
    if output.shape[-1] != horizon * len(QUANTILES):
        raise ValueError(f"outputs of width {output.shape[-1]} are neither {horizon} steps nor {horizon} x {len(QUANTILES)} quantiles")
    quantiles = np.sort(output.reshape(*output.shape[:-1], horizon, len(QUANTILES)), axis=-1)
    return quantiles[..., MEDIAN], quantiles


def band_of(level: float) -> tuple[int, int] | None:
    """The indices in QUANTILES of the central `level` % interval's bounds, None where the quantiles do not hold them."""
    low, high = round(0.5 - level / 200, 6), round(0.5 + level / 200, 6)
    if low in QUANTILES and high in QUANTILES:
        return QUANTILES.index(low), QUANTILES.index(high)
    return None
