"""The pieces every forecasting trial shares: a model's predictions, one project's windows from a source (the seeded
model is forecasting/run.py's `build_model`).
A campaign's trial and `gpufill train` run through forecasting/run.py, which builds their results (forecasting/trial.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gpufill.forecasting.data import (
    Split,
    WindowedProject,
    load_projects,
    make_windows,
)
from gpufill.engine.precision import autocast


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
