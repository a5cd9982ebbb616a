"""The pieces every forecasting trial shares: a model's predictions (a quantile network's read as its median and its
quantiles), one project's windows from a source (the seeded model is forecasting/run.py's `build_model`).
A campaign's trial and `gpufill train` run through forecasting/run.py, which builds their results (forecasting/trial.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from gpufill.forecasting.data import (
    Split,
    WindowedProject,
    load_projects,
    make_windows,
)
from gpufill.engine.losses import QUANTILES
from gpufill.engine.precision import autocast
from gpufill.forecasting.data.quantiles import MEDIAN


@torch.no_grad()
def predict(model: nn.Module, inputs: torch.Tensor, *, dtype: torch.dtype | None = None, batch: int = 4096) -> np.ndarray:
    """Model outputs for `inputs` in batches, on the model's device, as float64 numpy."""
    device = next(model.parameters()).device
    model.eval()
    outputs = []
    for start in range(0, inputs.shape[0], batch):
        with autocast(device.type, dtype):
            outputs.append(model(inputs[start : start + batch].to(device, non_blocking=True)).float())
    return torch.cat(outputs).cpu().double().numpy()


def point_and_quantiles(output: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(point forecast (N, horizon), quantiles (N, horizon, Q) or None) of a network's outputs (N, horizon) or
    (N, horizon x Q): a quantile network's quantiles in order (a crossing pair of learned quantiles sorted:
    rearrangement, Chernozhukov et al. 2010, which never makes them worse) and their median its point forecast."""
    output = np.asarray(output)
    if output.shape[-1] == horizon:
        return output, None
    if output.shape[-1] != horizon * len(QUANTILES):
        raise ValueError(f"outputs of width {output.shape[-1]} are neither {horizon} steps nor {horizon} x {len(QUANTILES)} quantiles")
    quantiles = np.sort(output.reshape(*output.shape[:-1], horizon, len(QUANTILES)), axis=-1)
    return quantiles[..., MEDIAN], quantiles


def forecast_of(model: Any, windows: WindowedProject, inputs: torch.Tensor, region: str, dtype: torch.dtype | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """A network's forecasts of `inputs` (windows of `region`) in the data's units: (point (N, horizon), a quantile
    network's quantiles (N, horizon, Q) or None), in order (data/quantiles.py) and again after the way back, which
    reverses them where a window's scale is negative (mean scaling of a series below zero)."""
    return in_units(windows, predict(model, inputs, dtype=dtype), region)


def forecasts_of(model: Any, windows: Sequence[WindowedProject], region: str, dtype: torch.dtype | None
                 ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """`forecast_of` each project's windows of `region` ("val" or "test") by one model, their inputs joined: a global
    model's forward in batches of 4,096 windows instead of one small forward per project (M1's 617 series: 617 calls)."""
    inputs = [w.x_val if region == "val" else w.x_test for w in windows]
    outputs = predict(model, torch.cat(inputs), dtype=dtype)
    parts = np.split(outputs, np.cumsum([x.shape[0] for x in inputs])[:-1])
    return [in_units(w, part, region) for w, part in zip(windows, parts, strict=True)]


def in_units(windows: WindowedProject, output: np.ndarray, region: str) -> tuple[np.ndarray, np.ndarray | None]:
    """A network's outputs for windows of `region` as (point, quantiles or None) in the data's units (forecast_of)."""
    point, quantiles = point_and_quantiles(output, windows.horizon)
    if quantiles is None:
        return windows.inverse_target(point, region), None
    back = np.sort(np.stack([windows.inverse_target(quantiles[..., q], region) for q in range(quantiles.shape[-1])], axis=-1), axis=-1)
    return back[..., MEDIAN], back


def load_windows(
    source: str,
    *,
    project: str | None,
    lookback: int,
    horizon: int,
    split: Split,
    target: str = "target",
    project_column: str = "project",
    time_column: str | None = None,
    fill: str = "none",
) -> WindowedProject:
    """One project's windows from a data source (the first project when none is named)."""
    projects = load_projects(
        source,
        target=target,
        project_column=project_column,
        time_column=time_column,
        projects=[project] if project else None,
        fill=fill,
    )
    chosen = projects[project] if project else next(iter(projects.values()))
    return make_windows(chosen, lookback, horizon, split)
