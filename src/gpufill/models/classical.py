"""Classical forecasters on the CPU lane: ``linear``, ``rf``, ``xgb``, ``lgbm``.

Each sees the same windows as the neural families, flattened: ``(N, lookback, F)`` becomes
``(N, lookback * F)`` features (lagged target and covariates), and predicts ``(N, horizon)``.
Every family takes ``(n_features, lookback, horizon, *, <family params>, last_value_norm=True)``
and is registered by name with ``kind="classical"``.

The scheduler gives every trial an explicit thread count; ``fit(x, y, threads=, seed=)`` passes
it to the library (``n_jobs``) or, for ``linear``, caps the BLAS pool with threadpoolctl.
scikit-learn, XGBoost and LightGBM are imported when a model is built, not with
``gpufill.models``: importing scikit-learn's ensembles alone takes seconds, and every CLI
command would pay it. Built before the fit timer starts, so ``fit_s`` never includes an import.

:func:`train_classical` is the counterpart of ``forecast.train_forecaster``: windows in,
test metrics next to the naive forecast out, in the same result shape.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from gpufill.data import WindowedProject, forecast_metrics
from gpufill.errors import InputError
from gpufill.models.registry import build, check_params, register, resolve

try:  # a scikit-learn dependency; without it BLAS keeps its own thread count
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - scikit-learn always brings it
    ThreadpoolController = None

__all__ = [
    "ClassicalForecaster",
    "ClassicalRun",
    "LGBMForecaster",
    "LinearForecaster",
    "RandomForestForecaster",
    "WindowRegressor",
    "XGBForecaster",
    "train_classical",
]

_MAX_SEED = 2**32 - 1  # scikit-learn's random_state and numpy's seeds stop here


@runtime_checkable
class ClassicalForecaster(Protocol):
    """What a classical family's factory must build (user families included)."""

    def fit(self, x: np.ndarray, y: np.ndarray, *, threads: int, seed: int) -> None:
        """``x`` (N, lookback, F) float32/64, ``y`` (N, horizon), both in the scaled space."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(N, horizon) for ``x`` (N, lookback, F)."""


# --- parameter checks ------------------------------------------------------------------------


def _int(family: str, name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InputError(
            f"{name} must be a whole number >= {minimum}, got {value!r}",
            fix=f"set {name} to an int >= {minimum}",
            field=f"{family}.{name}",
        )
    return int(value)


def _real(family: str, name: str, value: object, *, low: float, high: float = math.inf, low_open: bool, fix: str) -> float:
    """A finite real in (low, high] (``low_open``) or [low, high]."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if math.isfinite(high) else ')'}"
        raise InputError(
            f"{name} must be a number in {interval}, got {value!r}",
            fix=fix,
            field=f"{family}.{name}",
        )
    return float(value)


def _fraction(family: str, name: str, value: object) -> float:
    return _real(family, name, value, low=0.0, high=1.0, low_open=True, fix=f"set {name} to a fraction in (0, 1], e.g. 0.8 or 1.0")


def _learning_rate(family: str, value: object) -> float:
    return _real(family, "learning_rate", value, low=0.0, low_open=True, fix="set learning_rate > 0, e.g. 0.05 or 0.1")


def _threads_and_seed(threads: object, seed: object) -> tuple[int, int]:
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise InputError(
            f"threads must be a whole number >= 1, got {threads!r}",
            fix="give the trial at least one CPU thread (the scheduler's cpu budget)",
            field="threads",
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= _MAX_SEED:
        raise InputError(
            f"seed must be a whole number in [0, 2**32 - 1], got {seed!r}",
            fix="use a non-negative int seed such as 0, 1, 2",
            field="seed",
        )
    return int(threads), int(seed)


@contextlib.contextmanager
def _blas_threads(threads: int) -> Iterator[None]:
    """Cap numpy's BLAS pool at ``threads`` (a no-op without threadpoolctl)."""
    if ThreadpoolController is None:  # pragma: no cover
        yield
        return
    with _blas_controller().limit(limits=threads, user_api="blas"):
        yield


@functools.cache
def _blas_controller() -> Any:
    """One scan of the loaded libraries per process: rescanning on every fit cost ~8 ms per trial."""
    return ThreadpoolController()


# --- shared base: shapes, flattening and last-value normalisation ----------------------------


class WindowRegressor:
    """Base of the four families: checks shapes, flattens windows, applies last-value normalisation.

    With ``last_value_norm`` the last observed target ``x[:, -1, 0]`` is subtracted from the
    target channel of the window and from ``y``, and added back to every predicted step, as in
    the neural families: a regressor that predicts zero is exactly the naive forecast, and the
    fit does not depend on the series' level (a model fitted on ``series + c`` predicts ``+ c``).
    For ``linear`` this also means the target-lag weights in the original space sum to one.
    Subclasses implement :meth:`_fit` and :meth:`_predict` on flat ``(N, lookback * F)`` float64.
    """

    family: ClassVar[str] = "classical"

    def __init__(self, n_features: int, lookback: int, horizon: int, *, last_value_norm: bool):
        self.n_features = _int(self.family, "n_features", n_features)
        self.lookback = _int(self.family, "lookback", lookback)
        self.horizon = _int(self.family, "horizon", horizon)
        if not isinstance(last_value_norm, bool):
            raise InputError(
                f"last_value_norm must be true or false, got {last_value_norm!r}",
                fix="set last_value_norm to true (predict the change from the last value) or false",
                field=f"{self.family}.last_value_norm",
            )
        self.last_value_norm = last_value_norm
        self.threads: int | None = None
        """Threads of the last fit; predict uses as many."""

    @property
    def n_inputs(self) -> int:
        """Features per flattened window."""
        return self.lookback * self.n_features

    def fit(self, x: np.ndarray, y: np.ndarray, *, threads: int, seed: int) -> None:
        threads, seed = _threads_and_seed(threads, seed)
        features, last = self._flatten(x)
        target = self._as_array(y, "target")
        if target.ndim != 2 or target.shape != (features.shape[0], self.horizon):
            raise InputError(
                f"{self.family} expects targets ({features.shape[0]}, {self.horizon}) for {features.shape[0]} windows, "
                f"got {target.shape}",
                fix="pass one row of horizon target values per window",
                field="target",
            )
        if features.shape[0] == 0:
            raise InputError(
                f"{self.family} got no training windows",
                fix="use a longer series or a shorter lookback so the train region holds a window",
                field="input",
            )
        if self.last_value_norm:
            target = target - last[:, None]
        self.threads = threads
        self._fit(features, target, threads, seed)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.threads is None:
            raise InputError(
                f"{self.family} model is not fitted",
                fix="call fit(x, y, threads=..., seed=...) before predict",
                field="model",
            )
        features, last = self._flatten(x)
        if features.shape[0] == 0:
            return np.zeros((0, self.horizon))
        out = np.asarray(self._predict(features), dtype=np.float64).reshape(features.shape[0], self.horizon)
        return out + last[:, None] if self.last_value_norm else out

    def _flatten(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, lookback*F) float64 features, normalised if asked, and the last target values (N,)."""
        window = self._as_array(x, "input")
        if window.ndim != 3 or window.shape[1:] != (self.lookback, self.n_features):
            raise InputError(
                f"{self.family} expects windows (N, {self.lookback}, {self.n_features}), got {window.shape}",
                fix="pass windows shaped (N, lookback, n_features) with the lookback and n_features the model was built for",
                field="input",
            )
        window = window.copy()  # float64, our own: normalised in place below
        last = window[:, -1, 0].copy()
        if self.last_value_norm:
            window[:, :, 0] -= last[:, None]
        return window.reshape(window.shape[0], self.n_inputs), last

    def _as_array(self, values: Any, name: str) -> np.ndarray:
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu().numpy()
        array = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(array)):
            raise InputError(
                f"{self.family} got NaN or infinite values in the {name}",
                fix="fill or drop missing values first (load_projects fill='ffill' or 'interpolate')",
                field=name,
            )
        return array

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


# --- linear: least squares / ridge -----------------------------------------------------------


@register("linear", kind="classical")
class LinearForecaster(WindowRegressor):
    """Least squares on the flattened window, with an intercept; ridge when ``alpha > 0``.

    Multi-output natively: one coefficient column per horizon step, one solve for all.
    ``alpha = 0`` is the minimum-norm least-squares solution (``numpy.linalg.lstsq``), so the
    constant zero column that last-value normalisation leaves (the last target lag) is harmless.
    The intercept is never penalised: X and y are centred before the solve, as scikit-learn does.
    """

    family = "linear"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        alpha: float = 0.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.alpha = _real(self.family, "alpha", alpha, low=0.0, low_open=False, fix="set alpha >= 0 (0: plain least squares)")
        self.coef_: np.ndarray | None = None
        """(lookback * F, horizon)"""
        self.intercept_: np.ndarray | None = None
        """(horizon,)"""

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:
        x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
        xc, yc = x - x_mean, y - y_mean
        with _blas_threads(threads):
            if self.alpha == 0.0:
                coef = np.linalg.lstsq(xc, yc, rcond=None)[0]
            else:  # (X'X + alpha I) is positive definite for alpha > 0: a plain solve
                gram = xc.T @ xc
                gram[np.diag_indices_from(gram)] += self.alpha
                coef = np.linalg.solve(gram, xc.T @ yc)
        self.coef_ = coef
        self.intercept_ = y_mean - x_mean @ coef

    def _predict(self, x: np.ndarray) -> np.ndarray:
        assert self.coef_ is not None and self.intercept_ is not None and self.threads is not None
        with _blas_threads(self.threads):
            return x @ self.coef_ + self.intercept_


# --- random forest ---------------------------------------------------------------------------


@register("rf", kind="classical")
class RandomForestForecaster(WindowRegressor):
    """scikit-learn ``RandomForestRegressor``; multi-output natively (one forest, vector leaves)."""

    family = "rf"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        n_estimators: int = 200,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        max_features: float | int | str = 1.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.n_estimators = _int(self.family, "n_estimators", n_estimators)
        self.max_depth = None if max_depth is None else _int(self.family, "max_depth", max_depth)
        self.min_samples_leaf = _int(self.family, "min_samples_leaf", min_samples_leaf)
        self.max_features = self._max_features(max_features)
        from sklearn.ensemble import RandomForestRegressor  # here, not at module import: see the docstring

        self._estimator_class = RandomForestRegressor
        self.estimator_: Any = None
        """The fitted ``RandomForestRegressor``."""

    def _max_features(self, value: object) -> float | int | str:
        """Features tried per split, as scikit-learn reads it: a float is a fraction, an int a count.

        So 1.0 (the default, scikit-learn's for regression) is all features but 1 is one feature.
        """
        if isinstance(value, str) and value in ("sqrt", "log2"):
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 1 <= value <= self.n_inputs:
            return int(value)
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
            return _fraction(self.family, "max_features", value)
        raise InputError(
            f"max_features must be a fraction in (0, 1], a count in [1, {self.n_inputs}] (lookback x features) "
            f"or 'sqrt'/'log2', got {value!r}",
            fix="set max_features to e.g. 1.0 (all features), 0.33 or 'sqrt'",
            field=f"{self.family}.max_features",
        )

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:
        self.estimator_ = self._estimator_class(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            max_features=self.max_features,
            n_jobs=threads,
            random_state=seed,
        )
        # a (N, 1) target makes scikit-learn warn and ravel; give it (N,) for one step
        self.estimator_.fit(x, y[:, 0] if self.horizon == 1 else y)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self.estimator_.predict(x)


# --- XGBoost ---------------------------------------------------------------------------------


@register("xgb", kind="classical")
class XGBForecaster(WindowRegressor):
    """``xgboost.XGBRegressor`` with ``tree_method="hist"``, all horizon steps in one booster.

    XGBoost >= 2 fits a 2-D target itself with ``multi_strategy="one_output_per_tree"`` (its
    default): each boosting round grows one tree per step. That is the same model as one
    regressor per step (identical predictions, checked on the synthetic project) in one call
    that builds the quantile sketch once. ``multi_output_tree`` (vector leaves) is a different,
    still experimental model, so it is not used.
    """

    family = "xgb"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        n_estimators: int = 300,
        max_depth: int = 6,
        learning_rate: float = 0.1,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.n_estimators = _int(self.family, "n_estimators", n_estimators)
        self.max_depth = _int(self.family, "max_depth", max_depth)
        self.learning_rate = _learning_rate(self.family, learning_rate)
        self.subsample = _fraction(self.family, "subsample", subsample)
        self.colsample_bytree = _fraction(self.family, "colsample_bytree", colsample_bytree)
        from xgboost import XGBRegressor

        self._estimator_class = XGBRegressor
        self.estimator_: Any = None
        """The fitted ``XGBRegressor``."""

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:
        self.estimator_ = self._estimator_class(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            subsample=self.subsample,
            colsample_bytree=self.colsample_bytree,
            tree_method="hist",
            n_jobs=threads,
            random_state=seed,
        )
        self.estimator_.fit(x, y[:, 0] if self.horizon == 1 else y)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self.estimator_.predict(x)


# --- LightGBM --------------------------------------------------------------------------------


@register("lgbm", kind="classical")
class LGBMForecaster(WindowRegressor):
    """``lightgbm.LGBMRegressor``, one per horizon step (LightGBM has no multi-output objective)."""

    family = "lgbm"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        n_estimators: int = 300,
        num_leaves: int = 31,
        learning_rate: float = 0.05,
        min_child_samples: int = 20,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.n_estimators = _int(self.family, "n_estimators", n_estimators)
        self.num_leaves = _int(self.family, "num_leaves", num_leaves, minimum=2)  # one leaf is no tree
        self.learning_rate = _learning_rate(self.family, learning_rate)
        self.min_child_samples = _int(self.family, "min_child_samples", min_child_samples)
        self.subsample = _fraction(self.family, "subsample", subsample)
        self.colsample_bytree = _fraction(self.family, "colsample_bytree", colsample_bytree)
        from lightgbm import LGBMRegressor

        self._estimator_class = LGBMRegressor
        self.estimators_: list[Any] = []
        """One fitted ``LGBMRegressor`` per horizon step."""

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:
        settings = dict(
            n_estimators=self.n_estimators,
            num_leaves=self.num_leaves,
            learning_rate=self.learning_rate,
            min_child_samples=self.min_child_samples,
            subsample=self.subsample,
            # LightGBM ignores subsample unless bagging is on: resample every iteration when asked
            subsample_freq=1 if self.subsample < 1.0 else 0,
            colsample_bytree=self.colsample_bytree,
            n_jobs=threads,
            random_state=seed,
            verbose=-1,  # no per-fit console lines
            # row-wise histograms chosen up front: LightGBM otherwise times both layouts on every
            # fit and picks by the clock; with deterministic, the same seed gives the same model
            force_row_wise=True,
            deterministic=True,
        )
        self.estimators_ = [self._estimator_class(**settings).fit(x, y[:, step]) for step in range(self.horizon)]

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return np.column_stack([estimator.predict(x) for estimator in self.estimators_])


# --- training entry point --------------------------------------------------------------------


@dataclass(slots=True)
class ClassicalRun:
    """A fitted classical forecaster and how it did on the test split, next to the naive forecast."""

    project: str
    family: str
    params: dict[str, Any]
    """The family's defaults updated with the given parameters."""
    test: dict[str, float]
    """forecast_metrics of the test predictions, original scale."""
    naive: dict[str, float]
    """forecast_metrics of the last-value forecast on the same test windows."""
    timings: dict[str, float]
    """fit_s, predict_s, samples_per_s (training windows / fit_s)."""
    threads: int
    model: Any = field(default=None, repr=False)
    """The fitted forecaster (not part of :meth:`to_dict`)."""

    @property
    def beats_naive(self) -> bool:
        return self.test["mae"] < self.naive["mae"]

    def to_dict(self) -> dict[str, Any]:
        """The same top-level keys as ``ForecastRun.to_dict``, so a store treats both kinds alike."""
        return {
            "project": self.project,
            "family": self.family,
            "params": self.params,
            "status": "completed",
            "plan": classical_plan(self.threads),
            "metrics": {"test": self.test, "naive": self.naive},
            "timings": self.timings,
            "history": [],  # no epochs: one fit
            "events": [],
        }


def classical_plan(threads: int) -> dict[str, dict[str, Any]]:
    """The plan of a classical training, in Plan.to_dict()'s shape."""
    return {
        "device": {"value": "cpu", "reason": "classical family: runs on the CPU lane"},
        "threads": {"value": threads, "reason": "given by the scheduler's CPU budget"},
    }


def train_classical(
    windows: WindowedProject,
    family: str,
    params: Mapping[str, Any] | None = None,
    *,
    threads: int = 1,
    seed: int = 0,
) -> ClassicalRun:
    """Build classical ``family`` with ``params``, fit it on the project's windows, score it on the test split."""
    resolved = check_params(family, params or {})
    kind = resolve(family).kind
    if kind != "classical":
        raise InputError(
            f"model family {family!r} is {kind}, not classical",
            fix="train neural families with forecast.train_forecaster (gpufill train), classical ones here",
            field="model",
        )
    threads, seed = _threads_and_seed(threads, seed)
    model = build(family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=resolved)
    if not isinstance(model, ClassicalForecaster):
        raise InputError(
            f"classical family {family!r} built a {type(model).__name__} without fit(x, y, *, threads, seed) and predict(x)",
            fix="return an object with those two methods from the factory (see models.classical.ClassicalForecaster)",
            field="model",
        )
    # Classical models have no epochs, so nothing to early-stop or select on the validation
    # split: it is folded into training, and the model sees all data before the test region.
    x = np.concatenate([windows.x_train.numpy(), windows.x_val.numpy()])
    y = np.concatenate([windows.y_train.numpy(), windows.y_val.numpy()])
    started = time.perf_counter()
    model.fit(x, y, threads=threads, seed=seed)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    scaled = model.predict(windows.x_test.numpy())
    predict_s = time.perf_counter() - started
    prediction = windows.inverse_target(np.asarray(scaled, dtype=np.float64))
    return ClassicalRun(
        project=windows.name,
        family=family,
        params=dict(resolved),
        test=forecast_metrics(windows.test_truth, prediction, windows.mase_scale),
        naive=forecast_metrics(windows.test_truth, windows.naive_test, windows.mase_scale),
        timings={"fit_s": fit_s, "predict_s": predict_s, "samples_per_s": x.shape[0] / fit_s if fit_s > 0 else 0.0},
        threads=threads,
        model=model,
    )
