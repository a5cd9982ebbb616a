"""The training entry point of a classical family: :func:`train_classical` fits one family on one project's windows
and scores it on the test split, next to the naive forecast (`gpufill estimate` times classical trials with it; a
campaign's trial runs through forecasting/run.py, which validates a window regressor with :func:`validate_regressor`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufill.errors import InputError
from gpufill.forecasting.data import WindowedProject
from gpufill.forecasting.data.scoring import ValidationScored, score, score_validation
from gpufill.forecasting.models.classical.base import ClassicalForecaster, _threads_and_seed
from gpufill.forecasting.models.classical.statistical import SeriesForecaster, fit_and_forecast, fit_and_validate
from gpufill.forecasting.models.registry import build, check_params, resolve

__all__ = ["ClassicalRun", "classical_plan", "train_classical", "validate_regressor"]


@dataclass(slots=True)
class ClassicalRun:
    """A fitted classical forecaster and how it did on the test split, next to the naive forecast."""

    project: str
    family: str
    params: dict[str, Any]
    """The family's defaults updated with the given parameters."""
    test: dict[str, float]
    """forecast_metrics of the test predictions, original scale."""
    val: dict[str, float] | None
    """forecast_metrics of the validation windows' forecasts by the model fitted on the train region alone (None
    without validation windows): what choosing between families reads."""
    naive: dict[str, float]
    """forecast_metrics of the last-value forecast on the same test windows."""
    timings: dict[str, float]
    """fit_s, predict_s, samples_per_s (training windows / fit_s), validate_s (the train-region fit and its forecasts)."""
    threads: int
    model: Any = field(default=None, repr=False)
    """The fitted forecaster (not part of :meth:`to_dict`)."""
    forecast: dict[str, Any] | None = field(default=None, repr=False)
    """The test forecasts kept (data.scoring)."""
    val_forecast: dict[str, Any] | None = field(default=None, repr=False)
    """The validation forecasts kept (data.scoring), None without validation windows."""

    @property
    def beats_naive(self) -> bool:
        return self.test["mae"] < self.naive["mae"]


def classical_plan(threads: int) -> dict[str, dict[str, Any]]:
    """The plan of a classical training, in Plan.to_dict()'s shape."""
    return {
        "device": {"value": "cpu", "reason": "classical family: runs on the CPU lane"},
        "threads": {"value": threads, "reason": "given by the scheduler's CPU budget"},
    }


def validate_regressor(model: ClassicalForecaster, x_train: np.ndarray, y_train: np.ndarray, windows: Sequence[WindowedProject], *,
                       threads: int, seed: int) -> list[ValidationScored | None]:
    """Each project's validation metrics and forecast (None where it has no validation windows) of `model` fitted on the train
    windows alone; the caller fits it again on train + validation for the test."""
    if not any(w.x_val.shape[0] for w in windows):
        return [None] * len(windows)
    model.fit(x_train, y_train, threads=threads, seed=seed)
    return [score_validation(w, w.inverse_target(np.asarray(model.predict(w.x_val.numpy()), dtype=np.float64), "val")) for w in windows]


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
        raise InputError(f"model family {family!r} is {kind}, not classical",
                         fix="train a neural family with gpufill train (forecasting/run.py: run_alone), classical ones here", field="model")
    threads, seed = _threads_and_seed(threads, seed)

    def built() -> Any:  # the validation's fit gets a model of its own: nothing it learned reaches the test's
        return build(family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=resolved)

    model = built()
    if isinstance(model, SeriesForecaster):  # snaive, ets, theta: fitted on the series, not on windows
        started = time.perf_counter()
        validated = fit_and_validate(built(), windows, threads=threads, seed=seed)
        validate_s = time.perf_counter() - started
        prediction, timings = fit_and_forecast(model, windows, threads=threads, seed=seed)
        test, naive, kept = score(windows, prediction)
        return ClassicalRun(project=windows.name, family=family, params=dict(resolved), test=test, val=validated and validated[0], naive=naive,
                            timings={**timings, "validate_s": validate_s}, threads=threads, model=model, forecast=kept,
                            val_forecast=validated and validated[1])
    if not isinstance(model, ClassicalForecaster):
        raise InputError(f"classical family {family!r} built a {type(model).__name__} without fit(x, y, *, threads, seed) and predict(x)",
                         fix="return an object with those two methods from the factory (see models.classical.ClassicalForecaster)", field="model")
    # No epochs to early-stop: fitted on the train windows, the model is scored on the validation windows (what a
    # choice between families reads), then fitted again on train + validation, all the data before the test region.
    started = time.perf_counter()
    validated = validate_regressor(built(), windows.x_train.numpy(), windows.y_train.numpy(), [windows], threads=threads, seed=seed)[0]
    validate_s = time.perf_counter() - started
    x = np.concatenate([windows.x_train.numpy(), windows.x_val.numpy()])
    y = np.concatenate([windows.y_train.numpy(), windows.y_val.numpy()])
    started = time.perf_counter()
    model.fit(x, y, threads=threads, seed=seed)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    scaled = model.predict(windows.x_test.numpy())
    predict_s = time.perf_counter() - started
    test, naive, kept = score(windows, windows.inverse_target(np.asarray(scaled, dtype=np.float64)))
    return ClassicalRun(
        project=windows.name,
        family=family,
        params=dict(resolved),
        test=test,
        val=validated and validated[0],
        naive=naive,
        forecast=kept,
        val_forecast=validated and validated[1],
        timings={"fit_s": fit_s, "predict_s": predict_s, "samples_per_s": x.shape[0] / fit_s if fit_s > 0 else 0.0, "validate_s": validate_s},
        threads=threads,
        model=model,
    )
