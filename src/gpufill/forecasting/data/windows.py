"""Splits, scaling and sliding windows: a Project becomes train/val/test tensors.

A window ending at t (exclusive) has x = features[t-lookback:t] and y = target[t:t+horizon].
It belongs to the region holding ALL its target steps; its inputs may reach back into
earlier regions (that is what a forecaster sees at that time, so it is no leak).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from gpufill.forecasting.data.project import Project, recipe_fingerprint
from gpufill.forecasting.data.split import Split, window_layout


@dataclass(frozen=True)
class Scaler:
    """Standard scaling per feature column, fitted on the train region only (no look-ahead)."""

    mean: np.ndarray
    """(F,)"""
    std: np.ndarray
    """(F,), zeros replaced by 1 so constant columns map to 0 instead of NaN."""

    @classmethod
    def fit(cls, features: np.ndarray) -> Scaler:
        mean = features.mean(axis=0)
        std = features.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        return cls(mean=mean, std=std)

    def transform(self, features: np.ndarray) -> np.ndarray:
        return (np.asarray(features, dtype=np.float64) - self.mean) / self.std

    def inverse_target(self, scaled: np.ndarray) -> np.ndarray:
        """Undo the scaling of column 0 (the target)."""
        return np.asarray(scaled, dtype=np.float64) * self.std[0] + self.mean[0]


@dataclass(frozen=True)
class WindowedProject:
    """A project cut into scaled float32 windows, plus what metrics need in original scale."""

    name: str
    lookback: int
    horizon: int
    n_features: int
    """1 + number of covariates; feature 0 is the target."""
    x_train: torch.Tensor
    """(N, lookback, F) float32, scaled."""
    y_train: torch.Tensor
    """(N, horizon) float32, scaled."""
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    scaler: Scaler
    test_truth: np.ndarray
    """(N_test, horizon) original scale."""
    naive_test: np.ndarray
    """(N_test, horizon) last target value of each lookback window, repeated; original scale."""
    mase_scale: float
    """Mean |y_t - y_(t-1)| over the train region, original scale (1.0 if that is 0)."""
    series: np.ndarray
    """(T,) the whole target, original scale: what a statistical (series) model fits and forecasts from."""
    fit_end: int
    """Where the test region starts: series models fit on series[:fit_end] (train + validation)."""
    test_origins: np.ndarray
    """(N_test,) the time each test window's forecast starts at (its lookback ends there)."""
    season_length: int
    """The season of the project's time index (project.season_length_of)."""
    backtest: bool = False
    """Test windows are rolling origins: metrics are the mean over origins, each origin's kept."""
    padding: Padding | None = None
    """Set when the series was too short for a full lookback and was left-padded (global mode)."""
    window_scaling: WindowScaling | None = None
    """Set when each window's target was scaled by its own inputs (forecasting.data.window_scaling)."""
    val_origins: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(N_val,) the time each validation window's forecast starts at: a series model fitted on series[:val_origins[0]]
    forecasts them to be scored on validation, as a network is."""
    data_id: str = ""
    """What names these windows on every machine: the project's fingerprint and how they were cut and scaled (their
    float values differ in the last bits from one CPU to the next). A training's checkpoint records it."""

    def inverse_target(self, scaled_pred: np.ndarray | torch.Tensor, region: str = "test") -> np.ndarray:
        """Predictions of a region's windows (test, or val) back in the original scale (each window's own scale
        when windows are scaled)."""
        if isinstance(scaled_pred, torch.Tensor):
            scaled_pred = scaled_pred.detach().to("cpu", torch.float64).numpy()
        if self.window_scaling is not None:
            return self.window_scaling.inverse(scaled_pred, region)
        return self.scaler.inverse_target(scaled_pred)

    def val_truth(self) -> np.ndarray:
        """(N_val, horizon) the validation windows' targets in the original scale: what a validation score compares with."""
        return self.inverse_target(self.y_val, "val")


@dataclass(frozen=True)
class Padding:
    """A short series left-padded by `size` steps (as neuralforecast does): padded inputs are 0 after
    scaling (the scaler's centre); targets are always real. `real_*`: each window's count of real inputs."""

    size: int
    real_train: np.ndarray
    real_val: np.ndarray
    real_test: np.ndarray


@dataclass(frozen=True)
class WindowScaling:
    """Each window's target scale: original = scaled * scale + loc, per window of each region ((N, 1) each)."""

    how: str
    train: tuple[np.ndarray, np.ndarray]
    val: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]

    def inverse(self, scaled: np.ndarray, region: str) -> np.ndarray:
        loc, scale = getattr(self, region)
        return np.asarray(scaled, dtype=np.float64) * scale + loc


def make_windows(
    project: Project, lookback: int, horizon: int, split: Split = Split(), stride: int = 1, *, pad: bool = False
) -> WindowedProject:
    """Cut ``project`` into scaled train/val/test windows.

    ``stride`` thins train and val windows (anchored at each region's last window, so the most
    recent data is always kept). Test windows always use stride 1, so test metrics cover every
    test point and stay comparable across strides.

    ``pad``: a series too short for one full lookback before its first training target is
    left-padded by lookback - 1 steps, and every window with at least one real input is kept
    (global mode: short series are the norm in competition data). A series long enough is cut
    exactly as without ``pad``.
    """
    layout = window_layout(project, lookback, horizon, split, stride, pad=pad)
    lookback, horizon, split, length = layout.lookback, layout.horizon, layout.split, project.length
    train_end, val_end, shift = layout.train_end, layout.val_end, layout.shift

    covariates = np.asarray(project.covariates, dtype=np.float64).reshape(length, -1 if project.covariates.size else 0)
    raw = np.column_stack([np.asarray(project.target, dtype=np.float64), covariates])
    scaler = Scaler.fit(raw[:train_end])
    scaled = scaler.transform(raw).astype(np.float32)
    # Padded, times below are shifted by `shift`: the padding is 0 after scaling, the scaler's centre.
    if shift:
        scaled = np.concatenate([np.zeros((shift, scaled.shape[1]), dtype=np.float32), scaled])

    # A window whose targets start at t reads scaled[t-lookback:t] as (lookback, F) and targets scaled[t:t+horizon, 0]:
    # each region's windows gathered by one fancy index (a copy, one allocation; cheaper than strided views for the
    # thousands of short series a global campaign cuts).
    back, ahead = np.arange(-lookback, 0), np.arange(horizon)

    def cut(starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(scaled[starts[:, None] + back]), torch.from_numpy(scaled[starts[:, None] + ahead, 0])

    train_t, val_t, test_t = layout.train_t, layout.val_t, layout.test_t
    x_train, y_train = cut(train_t + shift)
    x_val, y_val = cut(val_t + shift)
    x_test, y_test = cut(test_t + shift)
    padding = None
    if shift:
        padding = Padding(size=shift, real_train=np.minimum(train_t, lookback), real_val=np.minimum(val_t, lookback),
                          real_test=np.minimum(test_t, lookback))

    target = raw[:, 0]
    mase_scale = float(np.mean(np.abs(np.diff(target[:train_end])))) if train_end > 1 else 0.0
    if not np.isfinite(mase_scale) or mase_scale <= 0:
        mase_scale = 1.0  # constant train region: MASE would divide by 0; fall back to plain MAE
    return WindowedProject(
        name=project.name, lookback=lookback, horizon=horizon, n_features=raw.shape[1],
        x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val, x_test=x_test, y_test=y_test, scaler=scaler,
        test_truth=raw[test_t[:, None] + ahead, 0],
        naive_test=np.repeat(target[test_t - 1][:, None], horizon, axis=1),
        mase_scale=mase_scale,
        series=target,
        fit_end=val_end,
        test_origins=test_t,
        season_length=project.season_length(),
        backtest=split.backtest is not None,
        padding=padding,
        val_origins=val_t,
        data_id=recipe_fingerprint("gpufill.windows", 1, data=project.fingerprint(), lookback=lookback, horizon=horizon, stride=stride, pad=pad,
                                   split=[split.val, split.test, split.backtest]),
    )
