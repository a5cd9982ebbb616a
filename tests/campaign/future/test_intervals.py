"""campaign/future/intervals.py: split conformal half-widths, pooled where a series has too few windows; coverage, MSIS."""

from __future__ import annotations

import numpy as np
import pytest

from gpufill.campaign.future.intervals import calibrate, conformal_quantile, coverage, msis, windows_needed


def test_the_conformal_quantile_is_the_ceil_n_plus_1_level_th_smallest_error():
    errors = np.arange(1.0, 20.0)  # 19 errors
    assert windows_needed(95) == 19 and windows_needed(80) == 4 and windows_needed(90) == 9
    assert conformal_quantile(errors, 95) == 19.0  # ceil(20 x 0.95) = 19th
    assert conformal_quantile(errors, 80) == 16.0  # ceil(20 x 0.8) = 16th
    assert conformal_quantile(errors[:18], 95) == np.inf  # 18 errors cannot make a 95 % interval


def test_a_series_with_enough_windows_uses_its_own_errors_and_a_short_one_borrows_scaled_errors():
    rng = np.random.default_rng(0)
    long = rng.normal(0, 2.0, size=(40, 3))  # 40 windows of 3 steps, scale 2
    short = rng.normal(0, 10.0, size=(2, 3))  # 2 windows: too few for 95 %
    got = calibrate({"long": long, "short": short}, {"long": 2.0, "short": 10.0}, levels=(80, 95))
    assert (got["long"].source, got["long"].windows) == ("series", 40)
    np.testing.assert_allclose(got["long"].half_widths[95], [conformal_quantile(np.abs(long[:, h]), 95) for h in range(3)])
    pooled = np.concatenate([np.abs(long) / 2.0, np.abs(short) / 10.0])
    assert (got["short"].source, got["short"].windows) == ("pooled", 42)
    np.testing.assert_allclose(got["short"].half_widths[80], [10.0 * conformal_quantile(pooled[:, h], 80) for h in range(3)])
    lower, upper = got["long"].bounds(np.array([5.0, 5.0]), 80)  # a shorter forecast takes the first steps' widths
    np.testing.assert_allclose(upper - 5.0, got["long"].half_widths[80][:2])
    assert "none" not in got and calibrate({}, {"none": 1.0}) == {}  # no errors anywhere: no interval, never a made-up one


def test_conformal_intervals_cover_their_level_on_exchangeable_errors():
    rng = np.random.default_rng(1)
    calibration = calibrate({"s": rng.standard_t(4, size=(500, 1))}, {"s": 1.0}, levels=(80, 95))["s"]
    fresh = rng.standard_t(4, size=20_000)
    for level in (80, 95):
        lower, upper = calibration.bounds(np.zeros(1), level)
        assert coverage(fresh, lower, upper) == pytest.approx(level / 100, abs=0.02)


def test_msis_is_width_plus_the_miss_over_alpha_over_the_scale():
    truth = np.array([0.0, 5.0, -3.0])
    lower, upper = np.array([-1.0, -1.0, -1.0]), np.array([1.0, 1.0, 1.0])
    # widths 2 each; misses: 0, 4 above, 2 below; alpha 0.05: 2 / 0.05 = 40 per unit missed
    assert msis(truth, lower, upper, 95, scale=2.0) == pytest.approx((6 + 40 * 4 + 40 * 2) / 3 / 2.0)
    assert coverage(truth, lower, upper) == pytest.approx(1 / 3)


def test_a_quantile_band_is_moved_by_how_far_the_validation_values_fall_outside_it():
    """Conformalized quantile regression: a band of +-1 around the point and errors e score |e| - 1, so the band moves
    out by the conformal quantile of |e| minus 1: the symmetric interval exactly. Bands pool with bands only."""
    rng = np.random.default_rng(2)
    errors = rng.normal(0, 2.0, size=(40, 2))
    ones = np.ones((40, 2))
    got = calibrate({"banded": errors, "plain": errors * 10}, {"banded": 1.0, "plain": 1.0}, levels=(80,),
                    bands={"banded": {80: (-ones, ones)}})
    width = got["banded"].half_widths[80]
    np.testing.assert_allclose(width, [conformal_quantile(np.abs(errors[:, h]), 80) - 1 for h in range(2)])
    assert got["banded"].banded == frozenset({80}) and got["banded"].described == "series (quantiles)"
    point = np.array([5.0, 6.0])
    lower, upper = got["banded"].bounds(point, 80, (point - 1, point + 1))
    np.testing.assert_allclose(upper - point, width + 1)
    assert got["plain"].described == "series" and got["plain"].half_widths[80] == pytest.approx(10 * (width + 1))
    short = calibrate({"long": errors, "short": errors[:2], "plain": errors * 10}, {"long": 1.0, "short": 1.0, "plain": 1.0}, levels=(80,),
                      bands={"long": {80: (-ones, ones)}, "short": {80: (-ones[:2], ones[:2])}})["short"]
    pooled = np.concatenate([np.abs(errors) - 1, np.abs(errors[:2]) - 1])  # the banded series' scores, never the plain one's
    assert short.source == "pooled" and short.half_widths[80] == pytest.approx([conformal_quantile(pooled[:, h], 80) for h in range(2)])
    # a series whose forecast is a band but that has no validation window (a short series) borrows from the bands too
    unseen = calibrate({"long": errors, "plain": errors * 10}, {"long": 1.0, "plain": 1.0, "new": 1.0}, levels=(80,),
                       bands={"long": {80: (-ones, ones)}}, banded={"new": [80]})["new"]
    assert unseen.described == "pooled (quantiles)" and unseen.half_widths[80] == pytest.approx(width)


def test_a_band_that_follows_each_windows_spread_covers_its_level_in_narrower_intervals():
    """Half the windows 6x noisier than the others, a quantile band that knows which (though 20 % too narrow): moved by
    calibration it covers 80 % and its MSIS is below the symmetric interval's, which is as wide on calm windows as on
    wild ones."""
    rng = np.random.default_rng(3)
    sigma = np.where(rng.random((4000, 1)) < 0.5, 0.5, 3.0)
    errors = rng.normal(0, 1, size=(4000, 1)) * sigma
    half = 0.8 * 1.2816 * sigma  # the 10 % and 90 % quantiles of N(0, sigma), 20 % too narrow
    fit, fresh = slice(0, 2000), slice(2000, 4000)
    banded = calibrate({"s": errors[fit]}, {"s": 1.0}, levels=(80,), bands={"s": {80: (-half[fit], half[fit])}})["s"]
    plain = calibrate({"s": errors[fit]}, {"s": 1.0}, levels=(80,))["s"]
    truth, zero = errors[fresh], np.zeros((2000, 1))
    lower, upper = banded.bounds(zero, 80, (-half[fresh], half[fresh]))
    symmetric = plain.bounds(zero, 80)
    assert coverage(truth, lower, upper) == pytest.approx(0.80, abs=0.025) and coverage(truth, *symmetric) == pytest.approx(0.80, abs=0.025)
    assert msis(truth, lower, upper, 80, 1.0) < 0.85 * msis(truth, *symmetric, 80, 1.0)
