"""One trial's work as its `Outcome` for the scheduler: its result, or its error and traceback.

A trial that fails is data for the store (retried up to the campaign's limit), not a
worker crash; every way of running trials (one at a time, in a fused pack) reports through this.
A failure of the environment rather than of the trial (its data file missing, unreadable or
changed since the run began, a full disk) is marked `environment`: the scheduler
retries it later without counting it against the trial's retries.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import time
import traceback
from collections.abc import Callable

import numpy as np

from gpufill.campaign.policy.messages import Outcome
from gpufill.forecasting.trial import Trial, TrialResult

_FULL = (errno.ENOSPC, errno.EDQUOT)
"""OSError numbers of a full disk or an exhausted quota: the machine's failure, not the trial's."""


class EnvironmentFailure(RuntimeError):
    """The trial could not run for a reason outside it: its data could not be loaded, or is not the data its id names."""


def is_environment(error: BaseException) -> bool:
    """An EnvironmentFailure, or a full disk anywhere in the chain of causes (a library may wrap the OSError)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, EnvironmentFailure) or (isinstance(error, OSError) and error.errno in _FULL):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def failure(trial: Trial, error: BaseException) -> Outcome:
    """The outcome of a trial that failed with `error` (call inside its except block: the traceback is the current one)."""
    return Outcome(trial_id=trial.trial_id, ok=False, error=f"{type(error).__name__}: {error}".splitlines()[0], traceback=traceback.format_exc(),
                   environment=is_environment(error))


FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: stored forecasts must not pass it."""


class NonFiniteMetrics(ValueError):
    """A trial finished but its test metrics are NaN or infinite: a failure, not a result to rank."""


def attempt(trial: Trial, run: Callable[[], TrialResult]) -> Outcome:
    """Run one trial's work; its failure is data for the store, not a worker crash. A diverged training and
    test metrics that are not finite are failures: the campaign never ranks them."""
    started = time.perf_counter()
    try:
        result = run()
        if result.diverged:
            raise FloatingPointError(f"training diverged: {result.events[0] if result.events else 'non-finite loss'}")
        _check_finite(result)
        outcome = Outcome(trial_id=trial.trial_id, ok=True, result=result)
    except Exception as error:
        outcome = failure(trial, error)
    return dataclasses.replace(outcome, seconds=time.perf_counter() - started)


def _check_finite(result: TrialResult) -> None:
    test = result.metrics.get("test", {})
    bad = {name: value for name, value in test.items() if not math.isfinite(value)}
    if bad:
        listed = ", ".join(f"{name}={value}" for name, value in bad.items())
        raise NonFiniteMetrics(f"test metrics are not finite ({listed}): the predictions overflowed or the training diverged; "
                               "lower the learning rate, or check the data's scale")
    for project, kept in result.forecasts.items():  # kept as float32: past its range a forecast is inf there
        forecast = np.asarray(kept.get("forecast", []), dtype=np.float64)
        if forecast.size and not (np.abs(forecast) <= FLOAT32_MAX).all():
            raise NonFiniteMetrics(f"forecasts of {project} are not finite in float32 (the store keeps them so; its largest is {FLOAT32_MAX:.3g}): "
                                   "the predictions overflowed or the training diverged; lower the learning rate, or check the data's scale")
