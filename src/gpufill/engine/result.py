"""What fit() gives back: a FitResult with one EpochRecord per epoch, and the FitCallback hooks it calls."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from gpufill.engine.plan import Plan


@dataclass(slots=True)
class EpochRecord:
    epoch: int
    """1-based."""
    train_loss: float
    val_loss: float | None
    seconds: float
    lr: float
    """The first parameter group's learning rate at the epoch's end."""
    train_metrics: dict[str, float] = field(default_factory=dict)
    """The loss's other outputs (e.g. accuracy), sample-weighted means over the epoch."""
    val_metrics: dict[str, float] | None = None
    samples: int = 0
    """Training samples seen in the epoch (0 in checkpoints written before it was kept)."""
    steps: int = 0
    """Optimizer steps in the epoch."""


@dataclass(slots=True)
class FitResult:
    """The trained model (the best validation's weights unless restore_best=False), the plan it
    ran with, its history, and `metrics`: train_loss (last epoch), val_loss (best), best_epoch,
    epochs_run, and the loss's other outputs as train_<name> (last epoch) and val_<name> (best epoch)."""

    model: nn.Module
    plan: Plan
    history: list[EpochRecord]
    metrics: dict[str, float | int | None]
    timings: dict[str, float]
    events: list[str]
    status: Literal["completed", "early_stopped", "diverged"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "plan": self.plan.to_dict(),
            "metrics": self.metrics,
            "timings": self.timings,
            "history": [dataclasses.asdict(record) for record in self.history],
            "events": self.events,
        }


class FitCallback:
    """Hooks that fit() calls; override what you need (every hook is a no-op here)."""

    def on_fit_start(self, plan: Plan, epochs: int) -> None:
        """After the plan is final (compile resolved, checkpoint restored), before the first epoch."""

    def on_epoch_end(self, record: EpochRecord) -> None:
        """After each epoch (and its validation and checkpoint)."""
