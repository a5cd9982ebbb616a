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
