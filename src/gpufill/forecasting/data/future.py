"""The steps after a project's end, as windows can hold them: a project followed by placeholder steps.

Cut with its test region at the end (`Split(val=0, test=steps)`), the extended project trains on every real value
(the scaler too: fitted on the training region, all of the data) and its one test window's inputs are the last real
values: that window's forecast is the forecast past the end. The placeholders (the last value repeated, covariates
too) are only ever that window's targets, which nothing trains on and nothing scores.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpufill.forecasting.data.project import Project


def with_future(project: Project, steps: int) -> Project:
    """`project` followed by `steps` placeholder steps (its fingerprint stays the data's: nothing real was added)."""
    target = np.concatenate([project.target, np.full(steps, project.target[-1], dtype=project.target.dtype)])
    covariates = np.concatenate([project.covariates, np.repeat(project.covariates[-1:], steps, axis=0)])
    return dataclasses.replace(project, target=target, covariates=covariates, time=future_times(project.time, steps, extend=True),
                               origin=project.fingerprint())


def future_times(time: np.ndarray | None, steps: int, *, extend: bool = False) -> np.ndarray | None:
    """The times of the `steps` after `time`'s last (its inferred frequency; else its median step), or None without
    a time index; `extend`: `time` followed by them."""
    if time is None or len(time) < 2:
        return None
    import pandas as pd

    index = pd.Index(time)
    if isinstance(index, pd.DatetimeIndex):
        frequency = pd.infer_freq(index) if len(index) >= 3 else None
        ahead = (pd.date_range(index[-1], periods=steps + 1, freq=frequency)[1:] if frequency is not None
                 else index[-1] + (index[1:] - index[:-1]).median() * np.arange(1, steps + 1))
        after = np.asarray(ahead, dtype=time.dtype)
    else:
        step = np.median(np.diff(np.asarray(time, dtype=np.float64)))
        after = (np.asarray(time)[-1] + step * np.arange(1, steps + 1)).astype(np.asarray(time).dtype)
    return np.concatenate([time, after]) if extend else after
