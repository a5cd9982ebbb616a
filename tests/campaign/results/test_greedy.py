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
