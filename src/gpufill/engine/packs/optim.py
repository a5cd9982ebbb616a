"""A fused pack's optimizer step: AdamW over stacked parameters, and fp16 loss scaling.

Both take the pack's (K,) step mask, so a model that is stopped, diverged or (this step)
overflowed is left untouched while the rest of the pack steps, and neither reads the
device: no host sync in the hot loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# torch.amp.GradScaler's defaults: start high, halve on overflow, double after this many clean steps.
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000


class PackAdamW:
    """AdamW over stacked (K, ...) parameters with per-model lr, weight decay and step mask.

    The update is torch.optim.AdamW's, written out so lr and weight decay can be (K,)
    tensors and masked models are left untouched (no moment or step update either).
    """

    def __init__(self, params: Sequence[nn.Parameter], lr: torch.Tensor, weight_decay: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.weight_decay = lr, weight_decay
        self.beta1, self.beta2 = betas
        self.eps = eps
        k = lr.shape[0]
        self.steps = torch.zeros(k, device=lr.device)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, active: torch.Tensor) -> None:
        """One update for the models where `active` (K,) is true; the others keep p, m and v."""
        self.steps += active.to(self.steps.dtype)
        t = self.steps.clamp(min=1)
        step_size = self.lr / (1 - self.beta1**t)
        bias2_sqrt = torch.sqrt(1 - self.beta2**t)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            view = (-1,) + (1,) * (p.dim() - 1)
            keep = active.view(view)
            g = p.grad
            m.copy_(torch.where(keep, m.lerp(g, 1 - self.beta1), m))
            v.copy_(torch.where(keep, v * self.beta2 + (1 - self.beta2) * g * g, v))
            decayed = p * (1 - self.lr * self.weight_decay).view(view)
            denom = v.sqrt() / bias2_sqrt.view(view) + self.eps
            p.copy_(torch.where(keep, decayed - step_size.view(view) * m / denom, p))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class PackLossScaler:
    """Dynamic loss scaling for fp16 packs, the rule torch.amp.GradScaler applies, kept on the device.

    GradScaler drives a torch.optim.Optimizer and skips its whole step on overflow; here the
    "gradients are finite" flag is a device tensor that joins the pack's step mask, so the
    skip costs no sync. One scale serves the pack (as one GradScaler serves one model): an
    overflow halves it and skips that step for every model, as it would for each alone.
    """

    def __init__(self, device: torch.device, *, enabled: bool, init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL):
        self.enabled = enabled
        self.scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self.growth_interval = growth_interval
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale(self, params: Sequence[nn.Parameter]) -> torch.Tensor | None:
        """Divide the gradients by the scale in place and update the scale; a () bool tensor,
        True when every gradient is finite (None when scaling is off)."""
        if not self.enabled:
            return None
        found_inf = torch.zeros((), dtype=torch.float32, device=self.scale.device)
        grads = [p.grad for p in params if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, self.scale.double().reciprocal().float())
        finite = found_inf == 0
        torch._amp_update_scale_(self.scale, self._growth_tracker, found_inf, 2.0, 0.5, self.growth_interval)
        return finite
