"""Synthetic projects: determinism, shape, scale, and that they are learnable."""

from __future__ import annotations

import numpy as np
import pytest

from gpufill.forecasting.data import Project, make_windows, synthetic, synthetic_projects
from gpufill.forecasting.data.metrics import mae
from gpufill.errors import InputError


def test_names_shapes_and_source():
    projects = synthetic_projects(n_projects=3, length=500)
    assert list(projects) == ["p000", "p001", "p002"]
    p = projects["p001"]
    assert isinstance(p, Project) and p.name == "p001" and p.source == "synthetic" and p.time is None
    assert p.length == 500 and p.target.shape == (500,) and p.target.dtype == np.float64
    assert p.covariates.shape == (500, 2) and p.covariate_names == ("leading_indicator", "periodic_driver")
    assert not np.isnan(p.target).any() and not np.isnan(p.covariates).any()


def test_name_padding_grows_past_999():
    projects = synthetic_projects(n_projects=1001, length=10)
    assert next(iter(projects)) == "p0000" and list(projects)[-1] == "p1000"


def test_deterministic_and_independent_of_n_projects():
    a = synthetic_projects(n_projects=3, length=300, seed=7)
    b = synthetic_projects(n_projects=3, length=300, seed=7)
    c = synthetic_projects(n_projects=8, length=300, seed=7)
    for name in a:
        assert np.array_equal(a[name].target, b[name].target)
        assert np.array_equal(a[name].covariates, b[name].covariates)
        assert np.array_equal(a[name].target, c[name].target)  # project i does not depend on n_projects


def test_seeds_and_projects_differ():
    a = synthetic_projects(n_projects=2, length=300, seed=0)
    b = synthetic_projects(n_projects=2, length=300, seed=1)
    assert not np.allclose(a["p000"].target, b["p000"].target)
    assert not np.allclose(a["p000"].target, a["p001"].target)


def test_target_same_whatever_n_covariates():
    none = synthetic_projects(n_projects=1, length=300, n_covariates=0)["p000"]
    four = synthetic_projects(n_projects=1, length=300, n_covariates=4)["p000"]
    assert none.covariates.shape == (300, 0) and none.covariate_names == ()
    assert four.covariate_names == ("leading_indicator", "periodic_driver", "random_walk_2", "random_walk_3")
    assert np.array_equal(none.target, four.target)


def test_realistic_positive_scale():
    projects = synthetic_projects(n_projects=20)
    medians = np.array([np.median(p.target) for p in projects.values()])
    assert min(p.target.min() for p in projects.values()) > 0
    assert medians.min() > 30 and medians.max() < 700


def _linear_mae(w, features):
    def flat(x):
        x = x[:, :, features].reshape(len(x), -1).double().numpy()
        return np.column_stack([x, np.ones(len(x))])

    x = flat(w.x_train)
    # least squares via (lightly ridged) normal equations: much faster than SVD-based lstsq on 2 busy cores
    coef = np.linalg.solve(x.T @ x + 1e-6 * np.eye(x.shape[1]), x.T @ w.y_train.double().numpy())
    return mae(w.test_truth, w.inverse_target(flat(w.x_test) @ coef))


def test_linear_model_beats_naive_and_covariates_inform():
    for project in synthetic_projects(n_projects=5).values():
        w = make_windows(project, lookback=30, horizon=1)
        full = _linear_mae(w, [0, 1, 2])
        assert full < 0.8 * mae(w.test_truth, w.naive_test)  # strongly seasonal: naive is clearly beaten
        assert full < 0.8 * _linear_mae(w, [0])  # the covariates carry information about the target


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_projects": 0}, "n_projects"),
        ({"length": 1}, "length"),
        ({"n_covariates": -1}, "n_covariates"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_arguments(kwargs, field):
    with pytest.raises(InputError) as err:
        synthetic_projects(**kwargs)
    message = str(err.value)
    assert message.startswith(f"synthetic data: {field}:") and "fix: set" in message and "\n" not in message



# What each generator version draws, to rounding (other CPUs differ in the last bits): a change of what the
# generator draws must bump GENERATOR_VERSION, which is part of every synthetic fingerprint, so that no old result
# is kept under the id of data it was not trained on.
DRAWN_BY_VERSION = {
    1: {
        "p000": ([182.29673565363336, 246.98181844310577, 187.82645269375266], [-1.5282926734446338, 0.0, -4.095256597226976]),
        "p001": ([360.6195662701921, 492.85852938724196, 361.16555281942055], [0.4939277168621805, 0.0, -7.295563617695198]),
    },
}


def test_the_generator_draws_what_its_version_says():
    projects = synthetic_projects(n_projects=2, length=40, seed=0, n_covariates=3)
    for name, (targets, covariates) in DRAWN_BY_VERSION[synthetic.GENERATOR_VERSION].items():
        drawn = projects[name]
        now = ([drawn.target[i] for i in (0, 17, 39)], [drawn.covariates[i, j] for i, j in ((5, 0), (9, 1), (39, 2))])
        assert np.allclose(now[0], targets, rtol=1e-9, atol=0) and np.allclose(now[1], covariates, rtol=1e-9, atol=1e-12), (
            f"{name}: the generator's output changed: bump GENERATOR_VERSION in forecasting/data/synthetic.py and add what it draws here")
