"""An ensemble's lookbacks chosen on the validation window: of every contiguous range of the members' lookbacks, the
one whose combination scores best (`ensemble: {select: best}`).

Why a range, beside forward selection (greedy.py): with one validation window per series, validation and test
disagree by more than the members' differences, and forward selection fits that window's noise (its validation score
is the best of every way measured, its test score is not: docs/forecasting.md). A choice among n(n+1)/2 ensembles
of whole lookback ranges is coarse enough not to, and still lets a data set of short series take short lookbacks and
one of long series longer ones. Where a member's lookback is longer than a series' history before a window, the
`padded` rule (leave_out) drops it from that window's combination, in every range alike, as the test combination does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["RangeChoice", "range_name", "select_lookback_range"]


@dataclass(frozen=True, slots=True)
class RangeChoice:
    lookbacks: tuple[int, ...]
    """The chosen range: every member whose lookback is one of these joins."""
    score: float
    """Its combination's validation score."""
    scores: dict[str, float]
    """Every range's validation score, by its name ("12-24"; one lookback: "12"), in the order tried."""


def select_lookback_range(forecasts: np.ndarray, truth: np.ndarray, groups: np.ndarray, lookbacks: np.ndarray, *, metric: str,
                          combine: str = "median", scales: np.ndarray | None = None, fits: np.ndarray | None = None) -> RangeChoice:
    """The contiguous range of `lookbacks` (K,: each candidate's) whose `combine` of its members' validation forecasts
    `forecasts` (K, N, H) scores best against `truth` (N, H) in `metric` per series (`groups` (N,)), averaged over
    series; `scales` (G,): each series' MASE scale. `fits` (K, N): whether candidate k's lookback the history before
    row n's window fills (the padded rule); a row none of a range's members fits takes the range's shortest lookback.
    Ties: the first range tried (shortest lookbacks first, then the narrower). numpy and the metrics (torch) load here:
    `results --summary` names a kept row's range (`range_name`) without them."""
    import numpy as np

    from gpufill.forecasting.data.metrics import mean_over_series

    lookbacks = np.asarray(lookbacks)
    values = sorted({int(v) for v in lookbacks})
    ranges = [tuple(values[i : j + 1]) for i in range(len(values)) for j in range(i, len(values))]
    forecasts = np.asarray(forecasts, dtype=np.float64)
    scores: dict[str, float] = {}
    best: tuple[float, tuple[int, ...]] | None = None
    for chosen in ranges:
        inside = np.isin(lookbacks, chosen)
        joined = np.repeat(inside[:, None], forecasts.shape[1], axis=1)
        if fits is not None:
            shortest = lookbacks == chosen[0]
            filled = joined & fits
            joined = np.where(filled.any(axis=0), filled, shortest[:, None])
        masked = np.where(joined[:, :, None], forecasts, np.nan)
        combined = np.nanmedian(masked, axis=0) if combine == "median" else np.nanmean(masked, axis=0)
        score = float(mean_over_series(combined, truth, groups, metric, scales))
        scores[range_name(chosen)] = score
        if best is None or score < best[0]:
            best = (score, chosen)
    assert best is not None, "no lookbacks to choose from"
    return RangeChoice(lookbacks=best[1], score=best[0], scores=scores)


def range_name(lookbacks: tuple[int, ...] | list[int]) -> str:
    """"12-24" for a range of lookbacks, "12" for one."""
    return str(lookbacks[0]) if len(lookbacks) == 1 else f"{lookbacks[0]}-{lookbacks[-1]}"
