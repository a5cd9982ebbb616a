"""The four classical families, each a thin adapter from flat windows to its library.

``linear`` solves least squares with numpy; ``rf``, ``xgb`` and ``lgbm`` wrap scikit-learn,
XGBoost and LightGBM, and pass the trial's thread count to them as ``n_jobs``. Those libraries
are imported when a model is built, not with ``gpufill.forecasting.models``: importing scikit-learn's
ensembles alone takes seconds, and every CLI command would pay it. Built before the fit timer
starts, so ``fit_s`` never includes an import.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from gpufill.errors import InputError
from gpufill.forecasting.models.checks import whole_number
from gpufill.forecasting.models.classical.base import (
    WindowRegressor,
    _blas_threads,
    _fraction,
    _learning_rate,
    _real,
)

__all__ = ["LGBMForecaster", "LinearForecaster", "RandomForestForecaster", "XGBForecaster"]


# --- linear: least squares / ridge -----------------------------------------------------------


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
        self.n_estimators = whole_number(self.family, "n_estimators", n_estimators)
        self.max_depth = None if max_depth is None else whole_number(self.family, "max_depth", max_depth)
        self.min_samples_leaf = whole_number(self.family, "min_samples_leaf", min_samples_leaf)
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


# --- XGBoost ---------------------------------------------------------------------------------


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
        self.n_estimators = whole_number(self.family, "n_estimators", n_estimators)
        self.max_depth = whole_number(self.family, "max_depth", max_depth)
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


# --- LightGBM --------------------------------------------------------------------------------


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
        self.n_estimators = whole_number(self.family, "n_estimators", n_estimators)
        self.num_leaves = whole_number(self.family, "num_leaves", num_leaves, minimum=2)  # one leaf is no tree
        self.learning_rate = _learning_rate(self.family, learning_rate)
        self.min_child_samples = whole_number(self.family, "min_child_samples", min_child_samples)
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
