"""Ensemble members chosen on the validation window by forward selection with replacement (Caruana et al., 2004,
"Ensemble selection from libraries of models").

Start from no member; at each round add the candidate (any, again if it helps) whose joining gives the combination
with the best validation score; after every round keep the score; the answer is the shortest prefix with the best
score. A member picked twice counts twice in the median or mean: a weight learned on validation. Every candidate's
validation forecasts come from a model that never trained on the validation window's targets, and the
test window is never read: the test score of the chosen combination is a fair estimate of what it would do next.

Why it, beside `within` (a member joins when its own validation score is near the best member's): members are
chosen for what they add to the combination, so a member that is worse alone but errs differently (another
lookback, another loss) can join, and a data set's lookbacks are chosen on it (M1's short series want short ones,
M3's long ones longer)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpufill.forecasting.data.metrics import mean_over_series
from gpufill.forecasting.trial import METRICS

__all__ = ["Selection", "select_greedily"]

COMBINES = ("median", "mean")


@dataclass(frozen=True, slots=True)
class Selection:
    picks: tuple[int, ...]
    """The candidates' indices in the order they joined, a repeat where one joined again."""
    scores: tuple[float, ...]
    """The validation score after each round (scores[i]: the combination of picks[: i + 1])."""

    @property
    def weights(self) -> dict[int, int]:
        """candidate index -> how many times it joined."""
        return dict(Counter(self.picks))

    @property
    def score(self) -> float:
        """The kept combination's validation score (the last round kept)."""
        return self.scores[-1]


def select_greedily(forecasts: np.ndarray, truth: np.ndarray, groups: Sequence[int] | np.ndarray, *, metric: str = "smape",
                    combine: str = "median", rounds: int | None = None, scales: np.ndarray | None = None) -> Selection:
    """Forward selection with replacement over K candidates' validation forecasts `forecasts` (K, N, H) of the
    targets `truth` (N, H); row n belongs to series `groups[n]` (0..G-1). The score is `metric` per series (its rows
    together), averaged over series, as a global trial's is; `scales` (G,): each series' MASE scale, for "mase".
    `rounds`: at most this many (default 2K); the kept prefix is the shortest with the best score."""
    if metric not in METRICS or combine not in COMBINES:
        raise ValueError(f"metric must be one of {tuple(METRICS)} and combine one of {COMBINES}, got {metric!r}, {combine!r}")
    forecasts = np.asarray(forecasts, dtype=np.float64)
    truth = np.asarray(truth, dtype=np.float64)
    if forecasts.ndim != 3 or forecasts.shape[1:] != truth.shape or forecasts.shape[0] == 0:
        raise ValueError(f"forecasts (K, N, H) and truth (N, H) do not match: {forecasts.shape} and {truth.shape}")
    groups = np.asarray(groups, dtype=np.int64)
    rounds = rounds or 2 * forecasts.shape[0]
    picks: list[int] = []
    scores: list[float] = []
    total = np.zeros_like(truth)
    chosen = np.empty((0, *truth.shape))  # the picks' forecasts, sorted along the first axis (median)
    for _ in range(rounds):
        if combine == "mean":  # a running sum: each round is one pass over the candidates
            candidates = (total + forecasts) / (len(picks) + 1)
        else:
            candidates = _medians_with_each(chosen, forecasts)
        round_scores = mean_over_series(candidates, truth, groups, metric, scales)
        best = int(np.argmin(round_scores))  # ties: the first candidate, so the choice never depends on anything but the order given
        picks.append(best)
        scores.append(float(round_scores[best]))
        total += forecasts[best]
        if combine == "median":
            chosen = _inserted(chosen, forecasts[best])
    kept = int(np.argmin(scores)) + 1
    return Selection(picks=tuple(picks[:kept]), scores=tuple(scores[:kept]))


def _medians_with_each(chosen: np.ndarray, forecasts: np.ndarray) -> np.ndarray:
    """np.median of `chosen` (m, N, H, sorted along m) with each candidate (K, N, H) added, for all K at once and equal
    to it bit for bit: of m + 1 values the middle ones are a candidate clipped between `chosen`'s middle order
    statistics, so a round costs one pass over the candidates instead of a sort of m + 1 forecasts per candidate (the
    selection was cubic in the members: 36 members 98 s, 160 members hours)."""
    m = chosen.shape[0]
    if m == 0:
        return forecasts.copy()
    j = m // 2
    if m % 2 == 0:  # m + 1 odd: the j-th of m + 1 values
        return np.clip(forecasts, chosen[j - 1], chosen[j])
    low = forecasts if j == 0 else np.maximum(forecasts, chosen[j - 1])
    lower = np.minimum(low, chosen[j])  # the j-th of m + 1 values
    upper = np.maximum(forecasts, chosen[j]) if j + 1 == m else np.clip(forecasts, chosen[j], chosen[j + 1])  # the (j+1)-th
    return (lower + upper) / 2  # np.median's mean of the two middle values: the same sum, then the same division


def _inserted(chosen: np.ndarray, forecast: np.ndarray) -> np.ndarray:
    """`chosen` (m, N, H, sorted along m) with `forecast` (N, H) added, still sorted: one pass, no sort."""
    if chosen.shape[0] == 0:
        return forecast[None].copy()
    position = (chosen < forecast).sum(axis=0)  # per cell, how many chosen values lie below it
    index = np.arange(chosen.shape[0] + 1).reshape(-1, *(1,) * forecast.ndim)
    below = np.concatenate([chosen, chosen[-1:]])  # at index i < position: chosen[i]
    above = np.concatenate([chosen[:1], chosen])  # at index i > position: chosen[i - 1]
    return np.where(index < position, below, np.where(index == position, forecast, above))
