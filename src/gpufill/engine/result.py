"""What fit() gives back: a FitResult with one EpochRecord per epoch, and the FitCallback hooks it calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from gpufill.engine.plan import Plan


Status = Literal["completed", "early_stopped", "diverged", "pruned"]
"""How a training (or one row of a pack) ended: engine/epochs.py decides."""


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

    model: nn.Module | None
    """None only where `fit_many(..., keep_models=False)` let it go once trained."""
    plan: Plan
    history: list[EpochRecord]
    metrics: dict[str, float | int | None]
    timings: dict[str, float]
    events: list[str]
    status: Status

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "plan": self.plan.to_dict(),
            "metrics": self.metrics,
            "timings": self.timings,
            "history": [dataclasses.asdict(record) for record in self.history],
            "events": self.events,
        }


def throughput(seconds: Sequence[float], samples: Sequence[int]) -> tuple[float, float]:
    """(samples_per_s, epoch_s) of the epochs a training ran, given each one's seconds and samples trained.

    The first epoch is left out where there are more (it pays warm-up: allocator, cuDNN autotune, compile).
    samples_per_s: the samples the other epochs trained over the seconds they took, so an epoch that max_steps
    cut counts what it trained, not a whole epoch's samples (a cut epoch's samples over the mean of whole epochs'
    seconds read ~8x low). epoch_s: the seconds a whole epoch (the most samples any epoch trained) takes at that rate.
    """
    pairs = list(zip(seconds, samples, strict=True))
    steady = pairs[1:] or pairs
    spent, trained = sum(s for s, _ in steady), sum(n for _, n in steady)
    if spent <= 0 or trained <= 0:  # nothing trained (resumed after the last step), or a clock too coarse to see it
        return 0.0, (spent / len(steady) if steady else 0.0)
    rate = trained / spent
    return rate, max(n for _, n in pairs) / rate


def fit_timings(epoch_seconds: Sequence[float], epoch_samples: Sequence[int], *, data_s: float, val_s: float, probe_s: float,
                setup_s: float | None, wall_s: float) -> dict[str, float]:
    """A training's `FitResult.timings`: the first epoch pays warm-up (allocator, cuDNN autotune, compile), so it is
    reported apart and left out of the rate."""
    samples_per_s, epoch_s = throughput(epoch_seconds, epoch_samples)
    train_s = sum(epoch_seconds)
    return {
        "samples_per_s": samples_per_s,
        "epoch_s": epoch_s,
        "first_epoch_s": epoch_seconds[0] if epoch_seconds else 0.0,
        "train_s": train_s,
        "val_s": val_s,
        "data_s": data_s,
        "compute_s": max(0.0, train_s - data_s),
        "probe_s": probe_s,
        "setup_s": setup_s if setup_s is not None else 0.0,
        "wall_s": wall_s,
    }


class FitCallback:
    """Hooks that fit() calls; override what you need (every hook is a no-op here)."""

    def on_event(self, text: str) -> None:
        """Each line of the training's record (`FitResult.events`) as it is added: a setting the probe measured,
        the probe's cost, an early stop. Lines come before `on_fit_start` too, while the plan is measured."""

    def on_fit_start(self, plan: Plan, epochs: int) -> None:
        """After the plan is final (compile resolved, checkpoint restored), before the first epoch."""

    def on_epoch_end(self, record: EpochRecord) -> None:
        """After each epoch (and its validation and checkpoint)."""

    def stop(self, record: EpochRecord) -> str | None:
        """After on_epoch_end: a reason to end the training here (status "pruned": a search's pruner), or None to go on."""
        return None


class Events(list[str]):
    """A training's record of what it decided and what happened (`FitResult.events`), each line handed to
    `listeners` as it is added: how `gpufill train --json` says what a minutes-long probe is doing while it does it."""

    def __init__(self, listeners: Sequence[Callable[[str], None]] = ()):
        super().__init__()
        self.listeners = list(listeners)

    def append(self, text: str) -> None:
        super().append(text)
        for listener in self.listeners:
            listener(text)

    def extend(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for text in lines:
            self.append(text)
