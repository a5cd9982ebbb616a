"""What every classical family shares: the fit/predict contract, parameter checks, thread caps.

:class:`WindowRegressor` turns the neural families' windows into a flat regression problem:
``(N, lookback, F)`` becomes ``(N, lookback * F)`` features, with last-value normalisation on
the target channel, so a family only adapts its library to flat float64 arrays. The scheduler's
explicit thread count is checked here once; ``linear`` has no ``n_jobs``, so its BLAS pool is
capped with threadpoolctl.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from gpufill.errors import InputError
from gpufill.forecasting.models.checks import window_dims

try:  # a scikit-learn dependency; without it BLAS keeps its own thread count
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - scikit-learn always brings it
    ThreadpoolController = None

__all__ = ["ClassicalForecaster", "WindowRegressor"]

_MAX_SEED = 2**32 - 1  # scikit-learn's random_state and numpy's seeds stop here


@runtime_checkable
class ClassicalForecaster(Protocol):
    """What a classical family's factory must build (user families included)."""

    def fit(self, x: np.ndarray, y: np.ndarray, *, threads: int, seed: int) -> None:
        """``x`` (N, lookback, F) float32/64, ``y`` (N, horizon), both in the scaled space."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(N, horizon) for ``x`` (N, lookback, F)."""


# --- parameter checks ------------------------------------------------------------------------


def _real(family: str, name: str, value: object, *, low: float, high: float = math.inf, low_open: bool, fix: str) -> float:
    """A finite real in (low, high] (``low_open``) or [low, high]."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if math.isfinite(high) else ')'}"
        raise InputError(f"{name} must be a number in {interval}, got {value!r}",
                         fix=fix, field=f"{family}.{name}")
    return float(value)


def _fraction(family: str, name: str, value: object) -> float:
    return _real(family, name, value, low=0.0, high=1.0, low_open=True, fix=f"set {name} to a fraction in (0, 1], e.g. 0.8 or 1.0")


def _learning_rate(family: str, value: object) -> float:
    return _real(family, "learning_rate", value, low=0.0, low_open=True, fix="set learning_rate > 0, e.g. 0.05 or 0.1")


def _threads_and_seed(threads: object, seed: object) -> tuple[int, int]:
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise InputError(f"threads must be a whole number >= 1, got {threads!r}",
                         fix="give the trial at least one CPU thread (the scheduler's cpu budget)", field="threads")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= _MAX_SEED:
        raise InputError(f"seed must be a whole number in [0, 2**32 - 1], got {seed!r}",
                         fix="use a non-negative int seed such as 0, 1, 2", field="seed")
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
        self.n_features, self.lookback, self.horizon, self.last_value_norm = window_dims(
            self.family, n_features, lookback, horizon, last_value_norm, norm_meaning="predict the change from the last value"
        )
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
            raise InputError(f"{self.family} got no training windows",
                             fix="use a longer series or a shorter lookback so the train region holds a window", field="input")
        if self.last_value_norm:
            target = target - last[:, None]
        self.threads = threads
        self._fit(features, target, threads, seed)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.threads is None:
            raise InputError(f"{self.family} model is not fitted",
                             fix="call fit(x, y, threads=..., seed=...) before predict", field="model")
        features, last = self._flatten(x)
        if features.shape[0] == 0:
            return np.zeros((0, self.horizon))
        out = np.asarray(self._predict(features), dtype=np.float64).reshape(features.shape[0], self.horizon)
        return out + last[:, None] if self.last_value_norm else out

    def _flatten(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, lookback*F) float64 features, normalised if asked, and the last target values (N,)."""
        window = self._as_array(x, "input")
        if window.ndim != 3 or window.shape[1:] != (self.lookback, self.n_features):
            raise InputError(f"{self.family} expects windows (N, {self.lookback}, {self.n_features}), got {window.shape}",
                             fix="pass windows shaped (N, lookback, n_features) with the lookback and n_features the model was built for", field="input")
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
            raise InputError(f"{self.family} got NaN or infinite values in the {name}",
                             fix="fill or drop missing values first (load_projects fill='ffill' or 'interpolate')", field=name)
        return array

    def _fit(self, x: np.ndarray, y: np.ndarray, threads: int, seed: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict(self, x: np.ndarray) -> np.ndarray:
        """The fitted library estimator's predictions (`self.estimator_`, set by `_fit`); a family without one overrides this."""
        return self.estimator_.predict(x)
