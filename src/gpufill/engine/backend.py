"""The plan's settings applied through torch's APIs, old and new: backend flags, autocast,
gradient scaling, the optimizer kernel, and recognising out-of-memory errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from gpufill.errors import InputError
from gpufill.engine.plan import Plan


@contextlib.contextmanager
def backend_flags(plan: Plan) -> Iterator[None]:
    """Set TF32 and cudnn.benchmark for the training, and restore the user's values after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = plan.tf32.value
    torch.backends.cudnn.allow_tf32 = plan.tf32.value
    torch.backends.cudnn.benchmark = plan.cudnn_benchmark.value
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Autocast through whichever API this torch has (torch.autocast, else torch.cuda.amp)."""
    if dtype is None:
        return contextlib.nullcontext()
    if hasattr(torch, "autocast"):
        return torch.autocast(device_type=device_type, dtype=dtype)
    return torch.cuda.amp.autocast(dtype=dtype)  # pragma: no cover - torch < 1.10


def grad_scaler(device_type: str, enabled: bool) -> Any:
    """GradScaler through torch.amp (new API), else torch.cuda.amp (old API)."""
    try:
        return torch.amp.GradScaler(device_type, enabled=enabled)
    except (AttributeError, TypeError):  # pragma: no cover - torch < 2.3
        return torch.cuda.amp.GradScaler(enabled=enabled)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where work is synchronous). Timing code only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def is_out_of_memory(error: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(error, oom_type) or (isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def make_optimizer(model: nn.Module, cfg: Any, lr: float, kernel: str) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("the model has no trainable parameters", field="model", fix="pass a model with parameters that require grad")
    implementation = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[kernel]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=cfg.weight_decay, **implementation)
    optimizer_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return optimizer_cls(params, lr=lr, weight_decay=cfg.weight_decay, **implementation)
