"""FitConfig: what fit() takes, the one home of training defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from gpufill.errors import InputError
from gpufill.engine.plan import Plan, SpeedSettings

LossName = Literal["mse", "mae", "huber"]
LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mse": nn.functional.mse_loss,
    "mae": nn.functional.l1_loss,
    "huber": nn.functional.huber_loss,
}


@dataclass(kw_only=True, slots=True)
class FitConfig(SpeedSettings):
    """Training settings (what to learn) on top of the speed settings (how fast)."""

    epochs: int = 10
    lr: float = 1e-3
    """Learning rate at the reference batch; the plan scales it with the effective batch."""
    weight_decay: float = 0.0
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    loss: LossName = "mse"
    grad_clip: float | None = None
    """Max global gradient norm (None: off). Opt-in: on small models it costs ~8 % of a CPU step."""
    validate_every: int = 1
    patience: int | None = None
    """Early stopping: validations without improvement before stopping (None: off)."""
    min_delta: float = 0.0
    restore_best: bool = True
    """End with the weights of the best validation, not the last epoch (needs val data)."""
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 1
    resume: bool = False
    """Continue from checkpoint_dir's last checkpoint if there is one."""
    seed: int = 0
    """Seeds batch order and dropout (not the model's init, which happens before fit)."""

    def validate(self) -> None:
        for name in ("epochs", "validate_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}", field=name, fix=f"set {name} to a positive integer")
        if not self.lr > 0:
            raise InputError(f"lr must be positive, got {self.lr}", field="lr", fix="set lr to a positive number such as 1e-3")
        if self.loss not in LOSSES:
            raise InputError(f"unknown loss {self.loss!r}", field="loss", fix=f"use one of {', '.join(LOSSES)}")
        if self.optimizer not in ("adamw", "adam", "sgd"):
            raise InputError(f"unknown optimizer {self.optimizer!r}", field="optimizer", fix="use adamw, adam or sgd")
        if self.patience is not None and self.patience < 1:
            raise InputError(f"patience must be at least 1, got {self.patience}", field="patience", fix="set patience >= 1 or None to turn early stopping off")
        if self.resume and self.checkpoint_dir is None:
            raise InputError("resume needs a checkpoint directory", field="resume", fix="set checkpoint_dir")
        if not 0 < self.memory_margin <= 1:
            raise InputError(f"memory_margin must be in (0, 1], got {self.memory_margin}", field="memory_margin", fix="use e.g. 0.85")
