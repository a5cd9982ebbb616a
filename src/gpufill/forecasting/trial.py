"""A trial and its result, as types: what one training of one forecaster is, and what it gave.

A `Trial` is the frozen description the campaign expands, stores, queues and sends to a worker;
`TrialResult` is what every way of running one (alone, in a pack, global; `gpufill train` too) returns.
`trial_result` is the one place a result is built: the plan's recipe and pack entries and the peak
memory are given to it, never written into a result afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpufill.forecasting.metric_registry import METRICS

if TYPE_CHECKING:  # a Trial alone stays light: the store and the scheduler import it
    from gpufill.forecasting.recipes import Recipe

__all__ = ["GLOBAL_PROJECT", "METRICS", "PackEntry", "Trial", "TrialResult", "trial_result"]

GLOBAL_PROJECT = "*"
"""The project of a global-mode trial: one model over all projects."""


@dataclass(frozen=True, slots=True)
class Trial:
    """One training of one model configuration on one project with one seed."""

    trial_id: str
    """16 hex characters: a stable hash of everything that defines the trial (campaign/trials/trials.py)."""
    project: str
    """Project name; "*" in global mode."""
    family: str
    kind: Literal["neural", "classical"]
    params: dict[str, Any]
    """Model parameters exactly as in the grid point (sorted by key); defaults not filled in."""
    train: dict[str, Any]
    """Per-family training overrides from the grid point (lr, ...), sorted by key."""
    seed: int
    lookback: int
    shape: str
    """Group key for fusing into packs: same family, model params, lookback, batch_size and
    epochs (neural), or family and lookback (classical)."""
    data_fingerprint: str = ""
    """Hash of the project's values (in global mode: of every project's); "" when not known."""
    config_id: str = ""
    """The id without the seed: trials that differ only in their seed share it."""
    base_id: str = ""
    """Hash of what every trial of its kind shares (data and task settings, the train section):
    the store keeps that once, and with it each row's full effective configuration."""

    @property
    def is_global(self) -> bool:
        return self.project == GLOBAL_PROJECT


@dataclass(frozen=True, slots=True)
class PackEntry:
    """How many trials trained together with this one, and why (the plan's `pack_size` entry)."""

    size: int
    reason: str


@dataclass(frozen=True, slots=True)
class TrialResult:
    """What one trial gave: how it was trained (plan), how it did (metrics) and what it cost (timings)."""

    project: str
    family: str
    params: dict[str, Any]
    status: str
    """completed, early_stopped, ... or diverged (a campaign records a diverged trial as failed)."""
    plan: dict[str, dict[str, Any]]
    """setting -> {value, reason}: the engine's plan, the recipe's settings and the pack's size."""
    metrics: dict[str, Any]
    """test and naive (original scale), fit_* (the training's), per_origin or per_project where there are several."""
    timings: dict[str, Any]
    """The training's seconds and speed, and peak_memory_bytes (None off CUDA): what GPU admission learns."""
    history: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    forecasts: dict[str, Any] = field(default_factory=dict)
    """project -> the test forecasts kept (data.scoring)."""
    val_forecasts: dict[str, Any] = field(default_factory=dict)
    """project -> the validation forecasts kept (data.scoring: what an ensemble is scored on before the test)."""

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def to_message(self) -> dict[str, Any]:
        """The result as plain data: what the store records and `gpufill train --json` prints."""
        return {"project": self.project, "family": self.family, "params": self.params, "status": self.status, "plan": self.plan,
                "metrics": self.metrics, "timings": self.timings, "history": self.history, "events": self.events, "forecasts": self.forecasts,
                "val_forecasts": self.val_forecasts}


def trial_result(
    trial: Trial,
    *,
    status: str,
    plan: Mapping[str, dict[str, Any]],
    metrics: Mapping[str, Any],
    timings: Mapping[str, Any],
    history: list[dict[str, Any]] | None = None,
    events: list[str] | None = None,
    forecasts: Mapping[str, Any] | None = None,
    val_forecasts: Mapping[str, Any] | None = None,
    recipe: Recipe | None = None,
    pack: PackEntry | None = None,
    peak_memory_bytes: int | None = None,
    params: Mapping[str, Any] | None = None,
) -> TrialResult:
    """The one builder of a TrialResult. `recipe`: the scaling (and for a network loss and schedule) it trained
    with, recorded in the plan with the reasons; `pack`: recorded as the plan's pack_size; `params`: the model's
    parameters as built (default: the trial's)."""
    entries = dict(plan)
    if recipe is not None:
        entries.update(recipe.entries(neural=trial.kind == "neural"))
    if pack is not None:
        entries["pack_size"] = {"value": pack.size, "reason": pack.reason}
    return TrialResult(project=trial.project, family=trial.family, params=dict(trial.params if params is None else params), status=status,
                       plan=entries, metrics=dict(metrics), timings={**timings, "peak_memory_bytes": peak_memory_bytes},
                       history=list(history or []), events=list(events or []), forecasts=dict(forecasts or {}),
                       val_forecasts=dict(val_forecasts or {}))
