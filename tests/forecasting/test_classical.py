"""Classical forecasters (linear, rf, xgb, lgbm): accuracy vs naive, exact least squares,
last-value normalisation, seeds, threads, parameter and input errors, the result shape."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import threadpoolctl

from gpufill.forecasting.data import load_projects, mae, make_windows
from gpufill.errors import InputError
from gpufill.engine.config import FitConfig
from gpufill.forecasting.recipes import recipe
from gpufill.forecasting.run import run_alone, trial_setup
from gpufill.forecasting.trial import Trial
from gpufill.forecasting.models import build, check_params, families, register, registry
from gpufill.forecasting.models.classical import ClassicalRun, train_classical
from tests.helpers import registry_restored

FAMILIES = ["lgbm", "linear", "rf", "xgb"]
# Small ensembles keep the file fast; the defaults are measured in the report, not here.
SMALL = {
    "lgbm": {"n_estimators": 30},
    "linear": {},
    "rf": {"n_estimators": 20},
    "xgb": {"n_estimators": 30},
}


@pytest.fixture(scope="module")
def project():
    return next(iter(load_projects("synthetic", n_projects=1, length=800).values()))


@pytest.fixture(scope="module")
def windows(project):
    return make_windows(project, 30, 1)


@pytest.fixture(scope="module")
def windows_h3(project):
    return make_windows(project, 30, 3)


@pytest.fixture(scope="module")
def runs(windows):
    """One small training per family on the horizon-1 windows, shared by several tests.

    One thread: XGBoost's and LightGBM's OpenMP pools spin-wait, so two threads on a busy
    2-core machine can be 10x slower than one. Thread counts are tested apart, on small data.
    """
    return {family: train_classical(windows, family, SMALL[family], threads=1, seed=0) for family in FAMILIES}


@pytest.fixture
def restore_registry():
    with registry_restored():
        yield


def fitted(family: str, x: np.ndarray, y: np.ndarray, *, threads: int = 1, seed: int = 0, **params):
    model = build(family, n_features=x.shape[2], lookback=x.shape[1], horizon=y.shape[1], params={**SMALL[family], **params})
    model.fit(x, y, threads=threads, seed=seed)
    return model


# --- registry ---------------------------------------------------------------------------------


def test_classical_families_are_registered_with_their_defaults():
    assert families("classical") == sorted([*FAMILIES, "comb", "ets", "snaive", "theta"])  # + the statistical references
    assert check_params("ets", {}) == {"season_length": "auto", "model": "ZZZ"} and check_params("snaive", {}) == {"season_length": "auto"}
    assert all(registry.resolve(name).kind == "classical" for name in FAMILIES)
    assert check_params("linear", {}) == {"alpha": 0.0, "last_value_norm": True}
    assert check_params("rf", {"n_estimators": 50}) == {
        "n_estimators": 50,
        "max_depth": None,
        "min_samples_leaf": 1,
        "max_features": 1.0,
        "last_value_norm": True,
    }
    assert check_params("xgb", {}) == {
        "n_estimators": 300,
        "max_depth": 6,
        "learning_rate": 0.1,
        "subsample": 1.0,
        "colsample_bytree": 1.0,
        "last_value_norm": True,
    }
    assert check_params("lgbm", {}) == {
        "n_estimators": 300,
        "num_leaves": 31,
        "learning_rate": 0.05,
        "min_child_samples": 20,
        "subsample": 1.0,
        "colsample_bytree": 1.0,
        "last_value_norm": True,
    }


@pytest.mark.slow
def test_importing_models_does_not_import_the_tree_libraries():
    code = "import sys, gpufill.forecasting.models; print(sorted(m for m in ('sklearn', 'xgboost', 'lightgbm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


# --- accuracy, shapes, seeds ------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_each_family_beats_naive_on_the_synthetic_project(runs, windows, family):
    run = runs[family]
    assert run.naive["mae"] == pytest.approx(mae(windows.test_truth, windows.naive_test))
    # the synthetic project's seasonality is several times the noise: a fitted model is far better
    assert run.test["mae"] < 0.5 * run.naive["mae"]
    assert run.beats_naive
    prediction = run.model.predict(windows.x_test.numpy())
    assert prediction.shape == (windows.x_test.shape[0], 1)
    assert np.all(np.isfinite(prediction))
    # the stored test metrics are those of these predictions in the original scale
    assert run.test["mae"] == pytest.approx(mae(windows.test_truth, windows.inverse_target(prediction)))


@pytest.mark.parametrize("family", FAMILIES)
def test_horizon_3_predicts_every_step_and_beats_naive(windows_h3, family):
    run = train_classical(windows_h3, family, SMALL[family], threads=1)
    prediction = run.model.predict(windows_h3.x_test.numpy())
    assert prediction.shape == (windows_h3.x_test.shape[0], 3)
    assert np.all(np.isfinite(prediction))
    assert run.test["mae"] < 0.5 * run.naive["mae"]
    # the steps are not copies of one another
    assert not np.allclose(prediction[:, 0], prediction[:, 2])


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_gives_identical_predictions(windows, family):
    x, y = windows.x_train.numpy(), windows.y_train.numpy()
    # subsampling makes the seed matter for the boosted trees (rf bootstraps anyway)
    params = {"subsample": 0.7} if family in ("xgb", "lgbm") else {}
    first = fitted(family, x, y, threads=1, seed=3, **params).predict(windows.x_test.numpy())
    again = fitted(family, x, y, threads=1, seed=3, **params).predict(windows.x_test.numpy())
    np.testing.assert_array_equal(first, again)
    other = fitted(family, x, y, threads=1, seed=4, **params).predict(windows.x_test.numpy())
    if family == "linear":  # no randomness at all
        np.testing.assert_array_equal(first, other)
    else:
        assert not np.array_equal(first, other)


# --- linear: exact least squares --------------------------------------------------------------


def test_linear_alpha_0_recovers_an_exact_linear_rule():
    # lookback 2, one feature: y = 2 * x[t-2] - 1 * x[t-1] + 0.5 holds exactly on every window
    x = np.array([[1.0, 2.0], [2.0, 0.0], [0.0, 3.0], [4.0, 1.0], [3.0, 3.0]])[:, :, None]
    y = (2.0 * x[:, 0, 0] - 1.0 * x[:, 1, 0] + 0.5)[:, None]
    model = fitted("linear", x, y, last_value_norm=False)
    np.testing.assert_allclose(model.coef_[:, 0], [2.0, -1.0], atol=1e-12)
    np.testing.assert_allclose(model.intercept_, [0.5], atol=1e-12)
    np.testing.assert_allclose(model.predict(np.array([[[10.0], [-5.0]]])), [[25.5]], atol=1e-12)


def test_linear_alpha_0_equals_the_normal_equations():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3, 2))
    y = rng.normal(size=(40, 2))
    design = np.column_stack([x.reshape(40, 6), np.ones(40)])
    solution = np.linalg.solve(design.T @ design, design.T @ y)  # (A'A)^-1 A'y, intercept last
    model = fitted("linear", x, y, last_value_norm=False)
    np.testing.assert_allclose(model.coef_, solution[:6], atol=1e-10)
    np.testing.assert_allclose(model.intercept_, solution[6], atol=1e-10)
    np.testing.assert_allclose(model.predict(x), design @ solution, atol=1e-10)


def test_linear_ridge_matches_scikit_learn_and_shrinks():
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 4, 1))
    y = x[:, :, 0] @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + rng.normal(scale=0.1, size=(30, 1))
    model = fitted("linear", x, y, alpha=5.0, last_value_norm=False)
    reference = Ridge(alpha=5.0).fit(x.reshape(30, 4), y)
    np.testing.assert_allclose(model.coef_[:, 0], np.ravel(reference.coef_), atol=1e-10)
    np.testing.assert_allclose(model.intercept_, np.ravel(reference.intercept_), atol=1e-10)
    plain = fitted("linear", x, y, last_value_norm=False)
    assert np.linalg.norm(model.coef_) < np.linalg.norm(plain.coef_)


# --- last-value normalisation -----------------------------------------------------------------


def random_walk_windows(constant: float, lookback: int = 5, length: int = 400, seed: int = 0):
    series = np.cumsum(np.random.default_rng(seed).normal(size=length)) + constant
    starts = np.arange(length - lookback)
    x = np.stack([series[s : s + lookback] for s in starts])[:, :, None]
    y = series[starts + lookback][:, None]
    return x, y


def test_last_value_norm_makes_linear_level_invariant_on_a_random_walk():
    x, y = random_walk_windows(0.0)
    x_up, y_up = random_walk_windows(1000.0)
    model, model_up = fitted("linear", x, y), fitted("linear", x_up, y_up)
    # the level is subtracted before the fit: the same model, predictions shifted by the constant
    np.testing.assert_allclose(model_up.coef_, model.coef_, atol=1e-8)
    np.testing.assert_allclose(model_up.predict(x_up), model.predict(x) + 1000.0, atol=1e-8)
    # target-lag weights sum to one in the original space: shifting a window shifts its forecast
    np.testing.assert_allclose(model.predict(x + 250.0), model.predict(x) + 250.0, atol=1e-8)
    # a random walk's best forecast is its last value: the learnt change is small
    change = model.predict(x)[:, 0] - x[:, -1, 0]
    assert np.mean(np.abs(change)) < 0.1 * np.mean(np.abs(y[:, 0] - x[:, -1, 0]))
    # without it, plain least squares has no such constraint
    raw = fitted("linear", x, y, last_value_norm=False)
    assert abs(np.mean(raw.predict(x + 250.0) - raw.predict(x)) - 250.0) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_last_value_norm_predicts_naive_when_the_series_never_changes_after_the_window(family):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 4, 2))
    y = np.repeat(x[:, -1:, 0], 2, axis=1)  # every target equals the last observed value
    model = fitted(family, x, y)
    fresh = rng.normal(size=(7, 4, 2))
    np.testing.assert_allclose(model.predict(fresh), np.repeat(fresh[:, -1:, 0], 2, axis=1), atol=1e-6)


# --- threads reach the library ----------------------------------------------------------------


def test_threads_reach_the_tree_libraries(windows):
    # tiny fits: two OpenMP threads on a busy 2-core machine spin-wait (see the runs fixture)
    x, y = windows.x_train.numpy()[:80], windows.y_train.numpy()[:80]
    rf = fitted("rf", x, y, threads=2, n_estimators=4)
    assert rf.estimator_.n_jobs == 2 and rf.threads == 2
    xgb = fitted("xgb", x, y, threads=2, n_estimators=4)
    assert xgb.estimator_.get_params()["n_jobs"] == 2
    assert xgb.estimator_.get_params()["tree_method"] == "hist"
    lgbm = fitted("lgbm", x, y, threads=2, n_estimators=4)
    assert [e.n_jobs for e in lgbm.estimators_] == [2]
    assert lgbm.estimators_[0].booster_.params["num_threads"] == 2
    one = fitted("rf", x, y, threads=1, n_estimators=4)
    assert one.estimator_.n_jobs == 1


def test_linear_caps_blas_threads_during_the_solve(monkeypatch):
    seen: list[int] = []
    real_lstsq = np.linalg.lstsq

    def spy(*args, **kwargs):
        seen.extend(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
        return real_lstsq(*args, **kwargs)

    monkeypatch.setattr(np.linalg, "lstsq", spy)
    x, y = random_walk_windows(0.0)
    fitted("linear", x, y, threads=1)
    if not seen:
        pytest.skip("numpy's BLAS is not visible to threadpoolctl")
    assert set(seen) == {1}


# --- bad parameters and bad input ------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "params", "field"),
    [
        ("linear", {"alpha": -0.1}, "linear.alpha"),
        ("linear", {"alpha": "big"}, "linear.alpha"),
        ("linear", {"last_value_norm": "yes"}, "linear.last_value_norm"),
        ("rf", {"n_estimators": 0}, "rf.n_estimators"),
        ("rf", {"n_estimators": True}, "rf.n_estimators"),
        ("rf", {"max_depth": 0}, "rf.max_depth"),
        ("rf", {"min_samples_leaf": 0}, "rf.min_samples_leaf"),
        ("rf", {"max_features": 0.0}, "rf.max_features"),
        ("rf", {"max_features": 1.5}, "rf.max_features"),
        ("rf", {"max_features": 13}, "rf.max_features"),  # more than lookback 4 x 3 features
        ("rf", {"max_features": "auto"}, "rf.max_features"),
        ("rf", {"max_features": 0}, "rf.max_features"),
        ("rf", {"max_features": None}, "rf.max_features"),
        ("xgb", {"max_depth": 0}, "xgb.max_depth"),
        ("xgb", {"learning_rate": 0.0}, "xgb.learning_rate"),
        ("xgb", {"learning_rate": float("nan")}, "xgb.learning_rate"),
        ("xgb", {"subsample": 0.0}, "xgb.subsample"),
        ("xgb", {"colsample_bytree": 1.1}, "xgb.colsample_bytree"),
        ("lgbm", {"num_leaves": 1}, "lgbm.num_leaves"),
        ("lgbm", {"min_child_samples": 0}, "lgbm.min_child_samples"),
        ("lgbm", {"learning_rate": -0.05}, "lgbm.learning_rate"),
        ("lgbm", {"subsample": 2}, "lgbm.subsample"),
        ("lgbm", {"n_estimators": 2.5}, "lgbm.n_estimators"),
    ],
)
def test_bad_parameter_values_name_the_field(family, params, field):
    with pytest.raises(InputError) as err:
        build(family, n_features=3, lookback=4, horizon=1, params=params)
    assert err.value.field == field
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_good_parameter_values_are_accepted():
    rf = build("rf", n_features=3, lookback=4, horizon=1, params={"max_features": 12, "max_depth": 3})
    assert rf.max_features == 12 and rf.max_depth == 3
    assert build("rf", n_features=3, lookback=4, horizon=1, params={"max_features": "sqrt"}).max_features == "sqrt"
    assert build("lgbm", n_features=1, lookback=2, horizon=1, params={"subsample": 1}).subsample == 1.0


def test_unknown_parameter_names_the_field(windows):
    with pytest.raises(InputError) as err:
        check_params("xgb", {"eta": 0.3})
    assert err.value.field == "xgb.eta"
    with pytest.raises(InputError) as err:
        train_classical(windows, "rf", {"n_trees": 10})
    assert err.value.field == "rf.n_trees"


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "field"),
    [
        ((10, 4), (10, 1), "input"),  # not (N, lookback, F)
        ((10, 5, 2), (10, 1), "input"),  # wrong lookback
        ((10, 4, 3), (10, 1), "input"),  # wrong feature count
        ((10, 4, 2), (9, 1), "target"),  # one target row short
        ((10, 4, 2), (10, 2), "target"),  # wrong horizon
        ((0, 4, 2), (0, 1), "input"),  # no windows
    ],
)
def test_fit_rejects_bad_shapes(x_shape, y_shape, field):
    model = build("linear", n_features=2, lookback=4, horizon=1)
    with pytest.raises(InputError) as err:
        model.fit(np.zeros(x_shape), np.zeros(y_shape), threads=1, seed=0)
    assert err.value.field == field


def test_fit_and_predict_reject_bad_input():
    model = build("linear", n_features=1, lookback=3, horizon=1)
    x, y = np.ones((5, 3, 1)), np.ones((5, 1))
    with pytest.raises(InputError) as err:
        model.predict(x)
    assert err.value.field == "model"
    bad = x.copy()
    bad[2, 1, 0] = np.nan
    with pytest.raises(InputError) as err:
        model.fit(bad, y, threads=1, seed=0)
    assert err.value.field == "input"
    with pytest.raises(InputError) as err:
        model.fit(x, np.full((5, 1), np.inf), threads=1, seed=0)
    assert err.value.field == "target"
    for threads, seed, field in ((0, 0, "threads"), (True, 0, "threads"), (1, -1, "seed"), (1, 2**32, "seed"), (1, 1.5, "seed")):
        with pytest.raises(InputError) as err:
            model.fit(x, y, threads=threads, seed=seed)
        assert err.value.field == field
    model.fit(x, y, threads=1, seed=0)
    with pytest.raises(InputError) as err:
        model.predict(np.ones((5, 2, 1)))
    assert err.value.field == "input"
    assert model.predict(np.ones((0, 3, 1))).shape == (0, 1)


def test_train_classical_rejects_neural_families_and_bad_threads(windows):
    with pytest.raises(InputError) as err:
        train_classical(windows, "mlp")
    assert err.value.field == "model" and "neural" in str(err.value)
    with pytest.raises(InputError) as err:
        train_classical(windows, "linear", threads=0)
    assert err.value.field == "threads"


def test_train_classical_takes_a_user_family(windows, restore_registry):
    @register("last_value", kind="classical")
    class LastValue:
        def __init__(self, n_features, lookback, horizon):
            self.horizon = horizon

        def fit(self, x, y, *, threads, seed):
            pass

        def predict(self, x):
            return np.repeat(x[:, -1:, 0], self.horizon, axis=1)

    run = train_classical(windows, "last_value")
    # the last value, scaled to float32 and back, is the naive forecast
    assert run.test["mae"] == pytest.approx(run.naive["mae"], rel=1e-5)

    @register("broken", kind="classical")
    def broken(n_features, lookback, horizon):
        return object()

    with pytest.raises(InputError) as err:
        train_classical(windows, "broken")
    assert err.value.field == "model"


# --- the result ---------------------------------------------------------------------------------


def _trial(family: str, kind: str, params: dict) -> Trial:
    return Trial(trial_id="t", project="p", family=family, kind=kind, params=params, train={}, seed=0, lookback=12, shape="")


@pytest.mark.slow
def test_a_classical_trials_result_has_the_shape_of_a_networks(windows):
    classical = _trial("rf", "classical", {"n_estimators": 20})
    neural = _trial("mlp", "neural", {"hidden_size": 8})
    out = run_alone(classical, windows, trial_setup(classical, recipe("rf"), FitConfig(), threads=1)).to_message()
    net = run_alone(neural, windows, trial_setup(neural, recipe("mlp"), FitConfig(epochs=1), threads=1)).to_message()
    assert list(out) == list(net)
    assert out["status"] == "completed" and out["history"] == [] and out["events"] == []
    assert out["plan"] == {
        "device": {"value": "cpu", "reason": "classical family: runs on the CPU lane"},
        "threads": {"value": 1, "reason": "given by the scheduler's CPU budget"},
        "scaling": {"value": "project", "reason": recipe("rf").why["scaling"]},
    }
    alone = train_classical(windows, "rf", {"n_estimators": 20}, threads=1, seed=0)
    assert out["metrics"] == {"test": alone.test, "naive": alone.naive, "val": alone.val}  # the library call and the trial agree
    assert set(out["metrics"]["val"]) == set(net["metrics"]["val"]) == {"mae", "rmse", "smape", "mase"}  # scored on validation as a network
    assert out["metrics"]["naive"] == net["metrics"]["naive"]  # same windows, same naive forecast
    assert set(out["metrics"]["test"]) == {"mae", "rmse", "smape", "mase"}
    assert out["params"] == {**check_params("rf", {}), "n_estimators": 20}
    assert out["timings"]["peak_memory_bytes"] is None and net["timings"]["peak_memory_bytes"] is None  # off CUDA
    assert json.loads(json.dumps(out)) == out


def test_timings_count_train_and_val_windows(runs, windows):
    timings = runs["linear"].timings
    assert set(timings) == {"fit_s", "predict_s", "samples_per_s", "validate_s"}
    assert timings["fit_s"] > 0 and timings["predict_s"] > 0 and timings["validate_s"] > 0
    n_fit = windows.x_train.shape[0] + windows.x_val.shape[0]  # the val split is folded into training
    assert timings["samples_per_s"] == pytest.approx(n_fit / timings["fit_s"])
    assert isinstance(runs["linear"], ClassicalRun) and runs["linear"].threads == 1
