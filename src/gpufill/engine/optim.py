"""The optimizer and the learning-rate schedule, each with the reason the plan records.

AdamW by default keeps weight decay off biases and normalisation weights (every parameter
with fewer than two dimensions), as GPT-2/nanoGPT and BERT do: decaying a LayerNorm's gain
toward zero or a bias toward the origin only fights the model. A factory `params ->
Optimizer` is used as given; the plan's lr scale multiplies each group's lr.

Schedules are a multiplier of each group's base lr per optimizer step (torch's LambdaLR):
host arithmetic only, no device read, so the hot loop stays free of syncs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.optim_eager import eager_class
from gpufill.errors import InputError

# Warm-up of warmup_cosine and linear when warmup_steps is "auto": this share of all steps.
AUTO_WARMUP_SHARE = 0.05

_KERNEL_ARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


def make_optimizer(model: nn.Module, cfg: FitConfig, lr: float, kernel: str, *, lr_on: torch.device | None = None,
                   captured: bool = False, eager: bool = False) -> tuple[torch.optim.Optimizer, Choice[str]]:
    """The optimizer and its Choice. `lr_on`: hold the learning rate as a tensor on that device (a
    captured step reads it there, so a schedule's changes reach the replays). `captured`: its step will be
    recorded in a CUDA graph (Adam's step count then lives on the device: torch refuses to capture it otherwise).
    `eager`: nothing in the training is compiled, so the optimizer skips torch's lazy torch._dynamo import (optim_eager.py)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise InputError("the model has no trainable parameters", field="model", fix="pass a model with parameters that require grad")
    params = [p for _, p in named]
    if callable(cfg.optimizer):
        return _from_factory(cfg.optimizer, params, lr / cfg.lr)
    implementation: dict[str, Any] = dict(_KERNEL_ARGS[kernel])
    if captured and cfg.optimizer in ("adam", "adamw"):
        implementation["capturable"] = True
    rate: Any = torch.tensor(lr, device=lr_on) if lr_on is not None else lr
    sgd, adam, adamw = (eager_class(kind) if eager else kind for kind in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW))
    if cfg.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = sgd(params, lr=rate, momentum=0.9, weight_decay=cfg.weight_decay, **implementation)
        return optimizer, Choice("sgd", f"SGD, momentum 0.9, weight decay {cfg.weight_decay:g} on every parameter ({kernel} kernel)")
    if cfg.optimizer == "adam":
        optimizer = adam(params, lr=rate, weight_decay=cfg.weight_decay, **implementation)
        return optimizer, Choice("adam", f"Adam, L2 penalty {cfg.weight_decay:g} on every parameter ({kernel} kernel)")
    if cfg.weight_decay == 0:
        optimizer = adamw(params, lr=rate, weight_decay=0.0, **implementation)
        return optimizer, Choice("adamw", f"AdamW, no weight decay ({kernel} kernel)")
    decay = [p for _, p in named if p.dim() >= 2]
    plain = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    optimizer = adamw([g for g in groups if g["params"]], lr=rate, **implementation)
    reason = (f"AdamW ({kernel} kernel): weight decay {cfg.weight_decay:g} on {len(decay)} weight matrices and embeddings "
              f"({_count(decay)} values), none on {len(plain)} biases and norm weights ({_count(plain)} values)")
    return optimizer, Choice("adamw", reason)


def _from_factory(factory: Any, params: list[nn.Parameter], scale: float) -> tuple[torch.optim.Optimizer, Choice[str]]:
    name = getattr(factory, "__qualname__", type(factory).__name__)
    optimizer = factory(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InputError(f"optimizer factory {name} returned a {type(optimizer).__name__}, not a torch.optim.Optimizer", field="optimizer",
                         fix="return an optimizer built on the parameters passed in, e.g. lambda params: torch.optim.AdamW(params, lr=3e-4)")
    if scale != 1.0:
        for group in optimizer.param_groups:
            group["lr"] *= scale
    scaled = f"; each group's lr x {scale:.3g} (the plan's lr scale)" if scale != 1.0 else ""
    return optimizer, Choice(type(optimizer).__name__, f"your factory {name}: {len(optimizer.param_groups)} parameter group(s), as it set them{scaled}")


def _count(params: list[nn.Parameter]) -> str:
    total = sum(p.numel() for p in params)
    return f"{total / 1e6:.3g}M" if total >= 1e6 else f"{total:,}"


@dataclass(frozen=True)
class Multiplier:
    """lr multiplier per optimizer step: linear warm-up, then cosine or linear decay to min_ratio.

    A plain dataclass of numbers (with a __dict__: LambdaLR's state_dict stores a callable
    object's attributes), so a checkpoint of it loads with weights_only=True."""

    kind: str
    warmup: int
    total: int
    min_ratio: float

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.kind == "warmup_cosine" else 1 - progress
        return self.min_ratio + (1 - self.min_ratio) * shape


def schedule_multiplier(cfg: FitConfig, total_steps: int | None) -> tuple[Any, Choice[str]]:
    """(the lr multiplier per optimizer step, or None for a constant lr) and the plan's record of it: a `Multiplier`
    for a named schedule over `total_steps`, the user's function as given."""
    if callable(cfg.schedule):
        name = getattr(cfg.schedule, "__qualname__", type(cfg.schedule).__name__)
        return cfg.schedule, Choice(name, "your function of the optimizer step, times each group's lr")
    if cfg.schedule == "constant":
        return None, Choice("constant", "constant learning rate")
    if total_steps is None:
        raise InputError(f"schedule {cfg.schedule!r} needs the training's length, and this IterableDataset's is unknown", field="schedule",
                         fix="give steps_per_epoch, or use schedule='constant' or a function of the step")
    if cfg.warmup_steps == "auto":
        warmup, why = max(1, round(AUTO_WARMUP_SHARE * total_steps)), f"{AUTO_WARMUP_SHARE:.0%} of {total_steps} steps"
    else:
        warmup, why = int(cfg.warmup_steps), "requested"
    if warmup >= total_steps:
        raise InputError(f"warmup_steps {warmup} is not below the training's {total_steps} optimizer steps", field="warmup_steps",
                         fix=f"use fewer warm-up steps (e.g. {max(1, total_steps // 20)}) or auto")
    shape = "cosine" if cfg.schedule == "warmup_cosine" else "linear"
    reason = f"linear warm-up over {warmup} steps ({why}), then {shape} decay to {cfg.min_lr_ratio:g} x lr at step {total_steps}"
    return Multiplier(cfg.schedule, warmup, total_steps, cfg.min_lr_ratio), Choice(cfg.schedule, reason)


def make_schedule(optimizer: torch.optim.Optimizer, cfg: FitConfig, total_steps: int | None) -> tuple[Any, Choice[str]]:
    """(a LambdaLR, or None for a constant lr) and the plan's record of it."""
    multiplier, choice = schedule_multiplier(cfg, total_steps)
    return (None if multiplier is None else torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)), choice


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A checkpoint's optimizer state, stepped on as this plan steps: load_state_dict replaces each group's settings
    whole, and the saved run may have stepped otherwise (eager where this plan captures the step: a float lr that a
    graph would bake in, so its schedule would stop, or not `capturable`)."""
    built = [(group["lr"], group.get("capturable")) for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, (lr, capturable) in zip(optimizer.param_groups, built, strict=True):
        if isinstance(lr, torch.Tensor) and group["lr"] is not lr:  # the device tensor the captured step reads
            lr.copy_(torch.as_tensor(group["lr"], dtype=lr.dtype))
            group["lr"] = lr
        if capturable is not None:
            group["capturable"] = capturable


def resume_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict[str, Any]) -> None:
    """A resumed run's schedule at the step it stopped on. LambdaLR's constructor set each group's lr for step 0 and
    load_state_dict does not undo it: the lr the interrupted run would take its next step with is put back."""
    scheduler.load_state_dict(state)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
