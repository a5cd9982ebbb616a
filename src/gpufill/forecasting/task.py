"""One forecaster on one project: windows -> model -> fit(plan) -> test metrics vs naive, as a library call
(`train_forecaster`), and the pieces every trial shares: the seeded model and its predictions. A campaign's
trial and `gpufill train` run through forecasting/run.py, which builds their results (forecasting/trial.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from gpufill.forecasting.data.scoring import score
from gpufill.engine.config import FitConfig
from gpufill.engine.loop import fit
from gpufill.engine.result import FitCallback, FitResult
from gpufill.forecasting.models import registry
from gpufill.engine.precision import autocast


@dataclass(slots=True)
class ForecastRun:
    """A trained forecaster and how it did on the test split, next to the naive forecast."""

    project: str
    family: str
    params: dict[str, Any]
    fit: FitResult
    test: dict[str, float]
    naive: dict[str, float]
    forecast: dict[str, Any] | None = None
    """The test forecasts kept (data.scoring)."""

    @property
    def beats_naive(self) -> bool:
        return self.test["mae"] < self.naive["mae"]


def train_forecaster(
    windows: WindowedProject,
    family: str,
    params: Mapping[str, Any] | None = None,
    *,
    config: FitConfig | None = None,
    callbacks: Sequence[FitCallback] = (),
) -> ForecastRun:
    """Build `family` with `params`, train it on the project's windows, score it on the test split."""
    config = config or FitConfig()
    resolved = registry.check_params(family, params or {})
    model = seeded_model(family, windows, resolved, config.seed)
    has_val = windows.x_val.shape[0] > 0
    result = fit(
        model,
        (windows.x_train, windows.y_train),
        (windows.x_val, windows.y_val) if has_val else None,
        config=config,
        callbacks=callbacks,
    )
    scaled = predict(result.model, windows.x_test, dtype=result.plan.autocast_dtype)
    test, naive, kept = score(windows, windows.inverse_target(scaled))
    return ForecastRun(project=windows.name, family=family, params=dict(resolved), fit=result, test=test, naive=naive, forecast=kept)


def seeded_model(family: str, windows: WindowedProject, params: Mapping[str, Any], seed: int) -> Any:
    """The one place a forecaster is seeded and built: the same seed gives the same initial weights, whether it
    trains alone, in a pack or over every project (forecasting/run.py)."""
    torch.manual_seed(seed)
    return registry.build(family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=params)


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
