"""`ensemble:` a campaign's declared ensemble (N-BEATS' recipe: many models over lookbacks, losses and seeds).

    ensemble:
      families: [nbeats]        # members: every trial of these families (default: every learned family)
      lookbacks: [2, 3, 4, 5]   # multiples of task.horizon: each is trained as a lookback of the campaign
      losses: [mae, smape]      # each member family trains once per loss (a grid axis)
      combine: median           # or mean

The lookbacks and losses are folded into the campaign before it is checked (`fold_ensemble`): they become trials
like any other, so trials of one shape train as one pack and a re-run keeps what finished. After a run the
ensemble is combined per project from its members' stored test forecasts and scored like a trial
(campaign/ensembles.py: `declared_ensemble`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from gpufill.campaign.spec_types import Spec
from gpufill.forecasting.models import registry

__all__ = ["EnsembleSpec", "default_members", "fold_ensemble"]

LossName = Literal["mse", "mae", "huber", "smape"]


class EnsembleSpec(Spec):
    families: list[str] | None = None
    """Member families (each must be in `models`); None: every family but the statistical references."""
    lookbacks: list[float] | None = Field(default=None, min_length=1)
    """Multiples of task.horizon, each a lookback every member trains at."""
    losses: list[LossName] | None = Field(default=None, min_length=1)
    """Each member network trains once per loss."""
    combine: Literal["median", "mean"] = "median"


def default_members(families: list[str]) -> list[str]:
    """Every family but the statistical references (snaive, ets, theta: what an ensemble is measured against)."""
    references = {name for name in registry.families("classical") if registry.resolve(name).fits_series}
    return [name for name in families if name not in references]


def fold_ensemble(data: Any) -> Any:
    """The campaign file (a mapping) with its ensemble's lookbacks added to task.lookback and its losses added as a
    `loss` axis of each member network's grid; idempotent (a checked spec folds to itself). Anything malformed is
    left for validation to name."""
    if not isinstance(data, Mapping) or not isinstance(data.get("ensemble"), Mapping):
        return data
    ensemble, task, models = data["ensemble"], data.get("task"), data.get("models")
    if not isinstance(task, Mapping) or not isinstance(models, Mapping):
        return data
    folded = dict(data)
    horizon = task.get("horizon", 1)
    multiples = ensemble.get("lookbacks")
    if isinstance(multiples, list) and isinstance(horizon, int) and all(isinstance(m, int | float) and not isinstance(m, bool) and m > 0 for m in multiples):
        given = task.get("lookback", [30])
        given = given if isinstance(given, list) else [given]
        wanted = [max(1, round(m * horizon)) for m in multiples]
        folded["task"] = {**task, "lookback": list(dict.fromkeys([*given, *wanted]))}
    losses = ensemble.get("losses")
    if isinstance(losses, list) and losses:
        members = ensemble.get("families") or default_members(list(models))
        grids = dict(models)
        classical = set(registry.families("classical"))  # a loss is a network's: classical members join without one
        for name in members if isinstance(members, list) else []:
            if name not in grids or name in classical:  # an unknown member is named by the spec's check
                continue
            grid = grids[name]
            if isinstance(grid, Mapping) or grid is None:
                grid = dict(grid or {})
                given = grid.get("loss", [])
                grid["loss"] = list(dict.fromkeys([*(given if isinstance(given, list) else [given]), *losses]))
                grids[name] = grid
        folded["models"] = grids
    return folded
