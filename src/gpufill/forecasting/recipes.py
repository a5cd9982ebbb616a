"""How each built-in family is trained when the campaign leaves it to gpufill, and why.

Three settings shape a forecaster's training beyond its architecture: how each window is
scaled (`task.scaling`), the loss (`train.loss`) and the learning-rate schedule
(`train.schedule`). Each is "auto" by default, which means the family's recipe below; a value
in the campaign (or in a family's grid: ``lstm: {scaling: [mean, standard]}``) wins.
The reasons are printed with the plan, so an ablation's reader knows what every family got.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpufill.engine.config import REGRESSION_LOSSES, SCALE_FREE_LOSSES, FitConfig
from gpufill.errors import InputError
from gpufill.forecasting.data.scalings import ORIGIN_KEEPING
from gpufill.forecasting.family_names import base_name

AUTO = "auto"
LOSSES = REGRESSION_LOSSES


@dataclass(frozen=True)
class Recipe:
    scaling: str
    loss: str
    schedule: str
    why: dict[str, str] = field(default_factory=dict, compare=False)
    """setting -> the reason for its value."""

    def entries(self, *, neural: bool) -> dict[str, dict[str, Any]]:
        """This recipe's settings and reasons as a result's plan entries ({setting: {value, reason}}); loss and
        schedule only for a network (a classical model has neither)."""
        return {name: {"value": getattr(self, name), "reason": self.why.get(name, "")}
                for name in (("scaling", "loss", "schedule") if neural else ("scaling",))}

    def fit_config(self, base: FitConfig, **worker: Any) -> FitConfig:
        """The FitConfig a network of this recipe trains with: `base` (the training settings and seed) with this
        loss and schedule, and the worker's settings (device, threads, tune cache, memory margin) that are given."""
        return replace(base, loss=self.loss, schedule=self.schedule, **{key: value for key, value in worker.items() if value is not None})


_MAE = "absolute error, as the competition metrics (MAE, MASE, sMAPE) are, and neuralforecast's default for every model: robust to outlying windows"
_CONSTANT = ("constant lr with early stopping on validation: the stop decides the length; a decay would tie the result to the epoch "
             "budget (warmup_cosine or linear on request)")

def _network(scaling: str, why: str) -> Recipe:
    """A built-in network's recipe: its own scaling, MAE and a constant lr (the reasons above)."""
    return Recipe(scaling, "mae", "constant", {"scaling": why, "loss": _MAE, "schedule": _CONSTANT})


_RECURRENT = _network("mean", "mean scaling (DeepAR): the recurrence sees levels near 1, where its gates do not saturate")

RECIPES: dict[str, Recipe] = {
    "mlp": _network("last", "last value subtracted (NLinear): a feed-forward map learns the path's shape, not every level it may start from"),
    "lstm": _RECURRENT,
    "gru": _RECURRENT,
    "tcn": _network("standard", "each window standardised (RevIN): convolutions see one range of values across series and time"),
    "transformer": _network("standard", "each window standardised (RevIN, as PatchTST does): attention compares shapes, not levels"),
    "nbeats": _network("mean", "each window divided by its mean level: one network over series of every level, and N-BEATS' scale-free "
                               "losses (sMAPE, MASE) keep their meaning on it (mean scaling keeps the origin)"),
}

GENERIC = Recipe("project", "mse", "constant", {
    "scaling": "the project's standard scaling (fitted on its train region): what a window model gets unless its family has a recipe",
    "loss": "mean squared error, the engine's default", "schedule": "constant lr, the engine's default"})
"""Classical window models and the user's own families."""


def recipe(family: str, *, scaling: str = AUTO, loss: str = AUTO, schedule: str = AUTO) -> Recipe:
    """The family's recipe with the given (non-auto) settings in place of its defaults."""
    base = RECIPES.get(base_name(family), GENERIC)  # a variant (nbeats@mean) starts from its family's recipe
    given = {name: value for name, value in (("scaling", scaling), ("loss", loss), ("schedule", schedule)) if value != AUTO}
    resolved = replace(base, **given, why={**base.why, **dict.fromkeys(given, "set in the campaign")})
    if resolved.loss in SCALE_FREE_LOSSES and resolved.scaling not in ORIGIN_KEEPING:
        raise InputError(f"loss {resolved.loss} with scaling {resolved.scaling} for {family}: a percentage error needs values whose zero is the series' zero",
                         fix=f"use scaling: mean (or raw) with loss: {resolved.loss} (both keep the origin), or loss: mae", field="loss")
    return resolved

