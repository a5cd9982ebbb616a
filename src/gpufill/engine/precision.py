"""Precision: one object for autocast and loss scaling, used by single trainings and packs alike.

The loop never branches on "is a scaler on": it calls `autocast()`, `backward(loss)`,
`unscale_(optimizer)` (before clipping) and `step(optimizer)`; with bf16 or fp32 these are
plain calls. fp16 scales the loss so small gradients do not flush to zero:

- a single training steps a torch optimizer through torch.amp.GradScaler (its fused
  kernels take the overflow flag on the device);
- a fused pack steps its own masked optimizer, so the same dynamic rule (start at 2**16,
  halve on overflow, double after 2000 clean steps) is kept on the device and
  `finite_after_unscale` returns the "all gradients finite" flag as a tensor that joins
  the pack's step mask: an overflowed step is skipped for all K models with no sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

# torch.amp.GradScaler's defaults: start high, halve on overflow, double after this many clean steps.
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Autocast through whichever API this torch has (torch.autocast, else torch.cuda.amp)."""
    if dtype is None:
        return contextlib.nullcontext()
    if hasattr(torch, "autocast"):
        return torch.autocast(device_type=device_type, dtype=dtype)
    return torch.cuda.amp.autocast(dtype=dtype)  # pragma: no cover - torch < 1.10


class Precision:
    """Autocast dtype and loss scaling for one training (`masked=False`) or one fused pack (`masked=True`)."""

    def __init__(self, name: str, device: torch.device, *, loss_scaling: bool, masked: bool = False,
                 init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL):
        self.name = name
        self.device = device
        self.dtype: torch.dtype | None = _DTYPES.get(name)
        self.loss_scaling = loss_scaling
        self.masked = masked
        self._scaler: Any = None
        if loss_scaling and not masked:
            self._scaler = _grad_scaler(device.type, init_scale, growth_interval)
        # The masked (pack) rule's state, on the device.
        self.scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self.growth_interval = growth_interval
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    def switch(self, name: str) -> None:
        """Autocast to `name` from the next step on (a CPU training's live trial: bf16 and fp32 need no loss scaling)."""
        if self.loss_scaling or name == "fp16":
            raise ValueError("only a precision without loss scaling can be switched during a training")
        self.name, self.dtype = name, _DTYPES.get(name)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.device.type, self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if not self.loss_scaling:
            loss.backward()
        elif self.masked:
            (loss * self.scale).backward()
        else:
            self._scaler.scale(loss).backward()

    # -- single trainings: a torch optimizer --------------------------------------------------
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients back to their true size (before clipping them)."""
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._scaler is None:
            optimizer.step()
        else:
            self._scaler.step(optimizer)
            self._scaler.update()

    # -- packs: a masked optimizer -----------------------------------------------------------
    def finite_after_unscale(self, gradients: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """Divide `gradients` by the scale in place and update the scale; a () bool tensor,
        True when every gradient is finite (None when scaling is off). A pack passes its flat
        gradient with the rows of models not stepping zeroed: their NaNs must not skip the others' step."""
        if not self.loss_scaling:
            return None
        found_inf = torch.zeros((), dtype=torch.float32, device=self.device)
        grads = list(gradients)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, self.scale.double().reciprocal().float())
        finite = found_inf == 0
        torch._amp_update_scale_(self.scale, self._growth_tracker, found_inf, 2.0, 0.5, self.growth_interval)
        return finite

    def device_state(self) -> list[torch.Tensor]:
        """The masked rule's live tensors (a measurement puts them back afterwards)."""
        return [self.scale, self._growth_tracker]

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._scaler is not None:
            return {"grad_scaler": self._scaler.state_dict()}
        return {"scale": self.scale.detach().cpu(), "growth_tracker": self._growth_tracker.detach().cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._scaler is not None and "grad_scaler" in state:
            self._scaler.load_state_dict(state["grad_scaler"])
        elif "scale" in state:
            self.scale.copy_(state["scale"])
            self._growth_tracker.copy_(state["growth_tracker"])


def _grad_scaler(device_type: str, init_scale: float, growth_interval: int) -> Any:
    """GradScaler through torch.amp (new API), else torch.cuda.amp (old API)."""
    try:
        return torch.amp.GradScaler(device_type, init_scale=init_scale, growth_interval=growth_interval)
    except (AttributeError, TypeError):  # pragma: no cover - torch < 2.3
        return torch.cuda.amp.GradScaler(init_scale=init_scale, growth_interval=growth_interval)
