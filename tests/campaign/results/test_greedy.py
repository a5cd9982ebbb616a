"""Forward selection with replacement on validation forecasts (campaign/results/greedy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gpufill.campaign.results.greedy import select_greedily


def smape(forecast: np.ndarray, truth: np.ndarray, groups: np.ndarray) -> float:
    rows = (200 * np.abs(forecast - truth) / (np.abs(forecast) + np.abs(truth))).mean(axis=1)
    return float(np.mean([rows[groups == g].mean() for g in np.unique(groups)]))


@pytest.fixture
def windows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    truth = 100 + rng.normal(0, 10, size=(40, 6))
    groups = np.repeat(np.arange(10), 4)  # 10 series of 4 windows each
    return truth, groups


@pytest.mark.parametrize("combine", ["median", "mean"])
def test_two_members_that_err_in_opposite_directions_join_and_one_twice_as_bad_never_does(windows, combine):
    truth, groups = windows
    rng = np.random.default_rng(1)
    high, low = truth + 5 + rng.normal(0, 1, truth.shape), truth - 5 + rng.normal(0, 1, truth.shape)
    bad = truth + 10 + rng.normal(0, 1, truth.shape)  # alone twice as far off as either of the others
    picked = select_greedily(np.stack([bad, high, low]), truth, groups, combine=combine)
    assert 0 not in picked.weights and set(picked.weights) == {1, 2}
    alone = [smape(f, truth, groups) for f in (bad, high, low)]
    assert picked.score < 0.3 * min(alone)  # the pair cancels most of the error either makes alone
    # The score reported is the combination's own, recomputed by hand.
    members = np.stack([[high, low][i - 1] for i in picked.picks])
    combined = np.median(members, axis=0) if combine == "median" else members.mean(axis=0)
    assert picked.score == pytest.approx(smape(combined, truth, groups), rel=1e-9)
    assert picked.score == min(picked.scores) and len(picked.scores) == len(picked.picks)  # the kept prefix ends at its best round


def test_the_best_single_candidate_is_the_first_pick_and_a_repeat_is_a_weight(windows):
    truth, groups = windows
    rng = np.random.default_rng(2)
    good = truth + rng.normal(0, 1, truth.shape)
    close = truth + 2 + rng.normal(0, 1, truth.shape)
    noisy = truth - 3 + rng.normal(0, 4, truth.shape)
    picked = select_greedily(np.stack([close, good, noisy]), truth, groups, metric="mae", combine="mean", rounds=12)
    assert picked.picks[0] == 1 and picked.scores[0] == pytest.approx(np.abs(good - truth).mean(), rel=1e-9)
    assert len(picked.picks) <= 12 and sum(picked.weights.values()) == len(picked.picks)
    assert picked.score == min(picked.scores) and picked.score <= picked.scores[0]


def test_mismatched_shapes_and_unknown_settings_are_refused(windows):
    truth, groups = windows
    with pytest.raises(ValueError, match="do not match"):
        select_greedily(np.zeros((2, 40, 5)), truth, groups)
    with pytest.raises(ValueError, match="metric"):
        select_greedily(np.zeros((2, 40, 6)), truth, groups, metric="mape")
    with pytest.raises(ValueError, match="scale"):
        select_greedily(np.zeros((2, 40, 6)), truth, groups, metric="mase")


def _by_sorting(forecasts: np.ndarray, truth: np.ndarray, groups: np.ndarray, metric: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The selection as first written: each round, np.median of the picks with each candidate, sorted afresh."""
    from gpufill.forecasting.data.metrics import mean_over_series

    picks: list[int] = []
    scores: list[float] = []
    for _ in range(2 * forecasts.shape[0]):
        chosen = forecasts[picks]
        candidates = np.stack([np.median(np.concatenate([chosen, forecasts[k:k + 1]]), axis=0) for k in range(forecasts.shape[0])])
        round_scores = mean_over_series(candidates, truth, groups, metric, None)
        picks.append(int(np.argmin(round_scores)))
        scores.append(float(round_scores[picks[-1]]))
    kept = int(np.argmin(scores)) + 1
    return tuple(picks[:kept]), tuple(scores[:kept])


@pytest.mark.parametrize("seed", range(12))
def test_the_one_pass_median_picks_what_sorting_every_round_picks_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    k, n, h = int(rng.integers(1, 10)), int(rng.integers(4, 24)), int(rng.integers(1, 5))
    truth = rng.normal(10, 3, (n, h))
    forecasts = truth + rng.normal(0, 1, (k, n, h)) * rng.uniform(0.2, 2, (k, 1, 1))
    if seed % 3 == 0:
        forecasts[-1] = forecasts[0]  # two identical candidates: ties go to the first
    if seed % 4 == 0:
        forecasts = np.round(forecasts)  # many equal values in a cell
    groups = np.arange(n) % 4
    for metric in ("smape", "mae"):
        chosen = select_greedily(forecasts, truth, groups, metric=metric, combine="median")
        assert (chosen.picks, chosen.scores) == _by_sorting(forecasts, truth, groups, metric)
