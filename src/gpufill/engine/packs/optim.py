"""A fused pack's optimizer step: AdamW over stacked parameters with the pack's (K,) step mask,
so a model that is stopped, diverged or (this step) overflowed is left untouched while the
rest of the pack steps, without reading the device: no host sync in the hot loop. (fp16
loss scaling for packs is the masked mode of `engine.precision.Precision`.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


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
