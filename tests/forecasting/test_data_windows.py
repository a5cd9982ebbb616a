"""Splits, scaling and windowing: exact counts, exact slices, no look-ahead in the scaler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpufill.forecasting.data import Project, Split, make_windows, split_bounds
from gpufill.forecasting.data.window_scaling import scale_windows
from gpufill.errors import InputError


def _project(length: int = 100, n_covariates: int = 2, name: str = "demo") -> Project:
    rng = np.random.default_rng(0)
    t = np.arange(length, dtype=np.float64)
    target = 100 + 0.5 * t + 10 * np.sin(2 * np.pi * t / 7)
    covariates = rng.normal(size=(length, n_covariates)) * [1.0, 5.0][:n_covariates] + [3.0, -2.0][:n_covariates]
    names = ("a", "b")[:n_covariates]
    return Project(name, target, covariates.reshape(length, n_covariates), names, source=f"/data/{name}.csv")


def _raw(project: Project) -> np.ndarray:
    return np.column_stack([project.target, project.covariates])


# --- split_bounds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "length, split, bounds",
    [
        (1000, Split(), (700, 800)),
        (100, Split(val=0, test=18), (82, 82)),  # competition style: last 18 points
        (100, Split(val=10, test=18), (72, 82)),
        (200, Split(val=0.1, test=18), (162, 182)),
        (200, Split(val=0.0, test=0.25), (150, 150)),
    ],
)
def test_split_bounds(length, split, bounds):
    assert split_bounds(length, split) == bounds


@pytest.mark.parametrize(
    "split, field, words",
    [
        (Split(val=-1), "val", "negative"),
        (Split(test=1.0), "test", "outside [0, 1)"),
        (Split(test=-0.1), "test", "outside [0, 1)"),
        (Split(val=0.5, test=0.5), "val+test", "leave nothing to train on"),
        (Split(val="x"), "val", "neither a fraction nor a count"),
        (Split(test=True), "test", "neither a fraction nor a count"),
    ],
)
def test_split_errors(split, field, words):
    with pytest.raises(InputError) as err:
        split_bounds(100, split)
    message = str(err.value)
    assert message.startswith(f"split: {field}:") and words in message and "fix:" in message


def test_split_counts_larger_than_series():
    with pytest.raises(InputError, match=r"split: val\+test: a series of length 10 has no training region.*fix: lower"):
        split_bounds(10, Split(val=5, test=5))


# --- windows: counts and exact contents -------------------------------------------------------


def test_window_counts_and_shapes():
    w = make_windows(_project(100), lookback=10, horizon=3, split=Split(val=0.1, test=0.2))
    # train_end=70, val_end=80; target starts t: train [10, 67], val [70, 77], test [80, 97]
    assert (len(w.x_train), len(w.x_val), len(w.x_test)) == (58, 8, 18)
    assert w.x_train.shape == (58, 10, 3) and w.y_train.shape == (58, 3)
    assert w.test_truth.shape == w.naive_test.shape == (18, 3)
    assert (w.name, w.lookback, w.horizon, w.n_features) == ("demo", 10, 3, 3)
    for tensor in (w.x_train, w.y_train, w.x_val, w.y_val, w.x_test, w.y_test):
        assert tensor.dtype == torch.float32 and tensor.is_contiguous()


def test_window_contents_are_slices_of_the_scaled_series():
    p = _project(100)
    w = make_windows(p, lookback=10, horizon=3, split=Split(val=0.1, test=0.2))
    scaled = (_raw(p) - _raw(p)[:70].mean(0)) / _raw(p)[:70].std(0)
    np.testing.assert_allclose(w.x_train[0].numpy(), scaled[0:10], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.y_train[0].numpy(), scaled[10:13, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.x_train[-1].numpy(), scaled[57:67], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.y_train[-1].numpy(), scaled[67:70, 0], rtol=1e-6, atol=1e-6)
    # the first val window's inputs reach back into the train region
    np.testing.assert_allclose(w.x_val[0].numpy(), scaled[60:70], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.y_val[0].numpy(), scaled[70:73, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.x_test[-1].numpy(), scaled[87:97], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w.y_test[-1].numpy(), scaled[97:100, 0], rtol=1e-6, atol=1e-6)
    # original-scale references come from the raw target
    np.testing.assert_array_equal(w.test_truth[0], p.target[80:83])
    np.testing.assert_array_equal(w.naive_test[:, 0], p.target[79:97])
    np.testing.assert_array_equal(w.naive_test[:, 2], p.target[79:97])


def test_scaler_is_fitted_on_the_train_region_only():
    p = _project(100)
    w = make_windows(p, lookback=10, horizon=3, split=Split(val=0.1, test=0.2))
    np.testing.assert_allclose(w.scaler.mean, _raw(p)[:70].mean(0))
    np.testing.assert_allclose(w.scaler.std, _raw(p)[:70].std(0))
    assert not np.allclose(w.scaler.mean, _raw(p).mean(0))  # the trend makes the whole-series mean differ


def test_constant_column_gets_std_one():
    p = _project(60)
    covariates = p.covariates.copy()
    covariates[:, 1] = 4.0
    p = Project(p.name, p.target, covariates, p.covariate_names, p.source)
    w = make_windows(p, lookback=5, horizon=1)
    assert w.scaler.std[2] == 1.0
    assert torch.all(w.x_train[:, :, 2] == 0)


def test_inverse_target_round_trip():
    p = _project(100)
    w = make_windows(p, lookback=10, horizon=3)
    np.testing.assert_allclose(w.inverse_target(w.y_test), w.test_truth, rtol=1e-5)
    np.testing.assert_allclose(w.inverse_target(w.y_test.numpy()), w.test_truth, rtol=1e-5)
    assert w.inverse_target(w.y_test).dtype == np.float64
    scaled = w.scaler.transform(_raw(p))
    np.testing.assert_allclose(w.scaler.inverse_target(scaled[:, 0]), p.target)


def test_mase_scale_from_train_region():
    p = _project(100)
    w = make_windows(p, lookback=10, horizon=3, split=Split(val=0.1, test=0.2))
    assert w.mase_scale == pytest.approx(np.mean(np.abs(np.diff(p.target[:70]))))
    flat = Project("flat", np.full(50, 7.0), np.zeros((50, 0)), (), "synthetic")
    assert make_windows(flat, lookback=5, horizon=1).mase_scale == 1.0  # guarded against 0


def test_stride_thins_train_and_val_but_not_test():
    p = _project(100)
    w = make_windows(p, lookback=10, horizon=3, split=Split(val=0.1, test=0.2), stride=5)
    # anchored at each region's most recent window: train starts 12, 17, ..., 67; val 72, 77
    assert (len(w.x_train), len(w.x_val), len(w.x_test)) == (12, 2, 18)
    full = make_windows(p, lookback=10, horizon=3, split=Split(val=0.1, test=0.2))
    assert torch.equal(w.x_train[-1], full.x_train[-1]) and torch.equal(w.x_train[0], full.x_train[2])
    assert torch.equal(w.y_val[0], full.y_val[2]) and torch.equal(w.x_test, full.x_test)


def test_empty_val_and_no_covariates():
    p = _project(50, n_covariates=0)
    w = make_windows(p, lookback=8, horizon=2, split=Split(val=0, test=10))
    assert w.n_features == 1
    assert w.x_val.shape == (0, 8, 1) and w.y_val.shape == (0, 2)
    assert (len(w.x_train), len(w.x_test)) == (40 - 8 - 2 + 1, 10 - 2 + 1)


def test_competition_style_single_test_window():
    w = make_windows(_project(100), lookback=20, horizon=18, split=Split(val=0, test=18))
    assert len(w.x_test) == 1
    np.testing.assert_array_equal(w.test_truth[0], _project(100).target[82:100])


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"lookback": 0}, "lookback"),
        ({"horizon": 0}, "horizon"),
        ({"stride": 0}, "stride"),
        ({"lookback": 2.5}, "lookback"),
    ],
)
def test_bad_sizes(kwargs, field):
    args = {"lookback": 10, "horizon": 1, "stride": 1} | kwargs
    with pytest.raises(InputError) as err:
        make_windows(_project(100), **args)
    message = str(err.value)
    assert message.startswith(f"project demo (/data/demo.csv): {field}: must be an integer >= 1")
    assert f"fix: set {field} to a positive integer" in message


def test_series_too_short_names_project_and_minimum():
    p = _project(40)
    with pytest.raises(InputError) as err:
        make_windows(p, lookback=30, horizon=2, split=Split(val=0.1, test=0.2))
    message = str(err.value)
    for words in ("project demo", "/data/demo.csv", "length", "40 <", "lookback=30", "horizon=2",
                  "val=0.1 test=0.2", "fix: lower lookback or horizon, or the split sizes"):
        assert words in message, words
    need = int(message.split("40 < ")[1].split()[0])
    make_windows(_project(need), lookback=30, horizon=2, split=Split(val=0.1, test=0.2))  # the stated minimum works
    with pytest.raises(InputError):
        make_windows(_project(need - 1), lookback=30, horizon=2, split=Split(val=0.1, test=0.2))


@pytest.mark.parametrize(
    "split",
    [
        Split(val=0.3, test=0.01),
        Split(val=7, test=5),
        Split(val=0.05, test=18),
        Split(val=0.45, test=0.45),
        Split(val=0.0, test=0.5),
    ],
)
def test_stated_minimum_length_is_exact(split):
    with pytest.raises(InputError) as err:
        make_windows(_project(20), lookback=12, horizon=5, split=split)
    need = int(str(err.value).split("20 < ")[1].split()[0])
    make_windows(_project(need), lookback=12, horizon=5, split=split)
    with pytest.raises(InputError, match="series too short"):
        make_windows(_project(need - 1), lookback=12, horizon=5, split=split)


@pytest.mark.parametrize(
    "split, field, words",
    [
        (Split(val=0.1, test=3), "split.test", "split.test=3 is smaller than horizon=5"),
        (Split(val=2, test=10), "split.val", "split.val=2 is smaller than horizon=5"),
        (Split(val=0.1, test=0), "split.test", "leaves no test region"),
        (Split(val=0.1, test=0.0), "split.test", "leaves no test region"),
    ],
)
def test_split_counts_that_no_length_can_fix(split, field, words):
    with pytest.raises(InputError) as err:
        make_windows(_project(500), lookback=10, horizon=5, split=split)
    message = str(err.value)
    assert message.startswith(f"project demo (/data/demo.csv): {field}:") and words in message and "fix: set" in message


# --- padding (global mode) and per-window scaling ------------------------------------------------


def test_a_short_series_is_left_padded_with_real_targets_and_a_long_one_is_cut_as_without_padding():
    short = _project(length=30, n_covariates=1)
    with pytest.raises(InputError, match="series too short: length 30 < 42"):
        make_windows(short, 24, 6, Split(val=6, test=6))
    w = make_windows(short, 24, 6, Split(val=6, test=6), pad=True)
    assert w.padding.size == 23 and (w.x_train.shape, w.x_val.shape, w.x_test.shape) == ((12, 24, 2), (1, 24, 2), (1, 24, 2))
    assert w.padding.real_train.tolist() == list(range(1, 13)) and w.padding.real_val.tolist() == [18] and w.padding.real_test.tolist() == [24]
    scaled = w.scaler.transform(_raw(short)).astype(np.float32)
    for i, real in enumerate(w.padding.real_train):  # window i forecasts from time i + 1: its last `real` inputs are the series' first
        assert torch.equal(w.x_train[i, 24 - real :], torch.from_numpy(scaled[:real])) and not w.x_train[i, : 24 - real].any()
        assert torch.equal(w.y_train[i], torch.from_numpy(scaled[real : real + 6, 0]))
    assert w.test_origins.tolist() == [24] and np.allclose(w.test_truth, short.target[24:30])
    long = _project(length=100)
    padded, plain = make_windows(long, 24, 6, Split(val=6, test=6), pad=True), make_windows(long, 24, 6, Split(val=6, test=6))
    assert padded.padding is None and torch.equal(padded.x_train, plain.x_train) and torch.equal(padded.y_test, plain.y_test)
    # Too short for the validation split as well (M1's shortest: 30 + 18 held out): it trains on its whole history.
    unvalidated = make_windows(_project(length=48), 24, 18, Split(val=18, test=18), pad=True)
    assert unvalidated.x_val.shape[0] == 0 and unvalidated.x_train.shape[0] == 12 and unvalidated.fit_end == 30
    with pytest.raises(InputError, match=r"series too short: length 12 < 13 .*one real input"):  # no training target is left
        make_windows(_project(length=12), 24, 6, Split(val=0, test=6), pad=True)


@pytest.mark.parametrize("how", ["last", "mean", "standard", "raw"])
def test_each_window_scaling_inverts_exactly_and_ignores_padding(how):
    w = make_windows(_project(length=30, n_covariates=1), 24, 6, Split(val=6, test=6), pad=True)
    scaled = scale_windows(w, how)
    assert torch.equal(scaled.x_train[:, :, 1], w.x_train[:, :, 1])  # covariates keep the project's scaling
    for region in ("train", "val", "test"):
        x, y = getattr(scaled, f"x_{region}"), getattr(scaled, f"y_{region}")
        loc, scale = getattr(scaled.window_scaling, region)
        real = getattr(w.padding, f"real_{region}")
        original = getattr(w, f"y_{region}").double().numpy() * w.scaler.std[0] + w.scaler.mean[0]
        np.testing.assert_allclose(y.double().numpy() * scale + loc, original, rtol=1e-5)
        for i, n in enumerate(real):
            assert not x[i, : 24 - n, 0].any()  # padding stays 0
            inputs = x[i, 24 - n :, 0].double().numpy()
            if how == "last":
                assert inputs[-1] == 0
            elif how == "mean" and n > 0:
                assert np.mean(np.abs(inputs)) == pytest.approx(1.0, rel=1e-5)
            elif how == "standard" and n > 1:
                assert (inputs.mean(), inputs.std()) == (pytest.approx(0.0, abs=1e-5), pytest.approx(1.0, rel=1e-4))
            elif how == "raw":  # the series' own values, as the project's scaler undoes them
                raw_inputs = getattr(w, f"x_{region}")[i, 24 - n :, 0].double().numpy() * w.scaler.std[0] + w.scaler.mean[0]
                np.testing.assert_allclose(inputs, raw_inputs, rtol=1e-6)
        if how == "raw":
            assert (loc == 0).all() and (scale == 1).all()
    np.testing.assert_allclose(scaled.inverse_target(scaled.y_test.numpy()), w.test_truth, rtol=1e-5)
    assert scale_windows(w, "project") is w


def test_windows_are_named_by_their_project_and_how_they_were_cut_and_scaled():
    from gpufill.forecasting.data import synthetic_projects
    from gpufill.forecasting.data.window_scaling import scale_windows

    project = synthetic_projects(n_projects=1, length=300)["p000"]
    base = make_windows(project, 24, 1, Split(val=0.1, test=0.2))
    assert base.data_id == make_windows(project, 24, 1, Split(val=0.1, test=0.2)).data_id != ""
    others = [make_windows(project, 12, 1, Split(val=0.1, test=0.2)), make_windows(project, 24, 2, Split(val=0.1, test=0.2)),
              make_windows(project, 24, 1, Split(val=0.2, test=0.2)), make_windows(project, 24, 1, Split(val=0.1, test=0.2), stride=2),
              scale_windows(base, "mean"), scale_windows(base, "standard"), scale_windows(base, "raw"), make_windows(synthetic_projects(n_projects=2, length=300)["p001"], 24, 1)]
    assert len({base.data_id, *(w.data_id for w in others)}) == 1 + len(others)
    assert scale_windows(base, "project").data_id == base.data_id  # the same windows
