"""A fused pack's optimizer step: AdamW over stacked parameters with the pack's (K,) step mask,
so a model that is stopped, diverged or (this step) overflowed is left untouched while the
rest of the pack steps, without reading the device: no host sync in the hot loop. (fp16
loss scaling for packs is the masked mode of `engine.precision.Precision`.)

Every parameter lives in one flat (K, P) buffer (the module's parameters become views into
it), and so do the moments: the step is about twenty operators for the whole pack however
many tensors the model has (one cat gathers the gradients), where a per-parameter loop
issues about twenty per parameter: 80 % of a TCN or Transformer pack's step on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def flatten_into_rows(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Move stacked (K, ...) parameters into one (K, P) buffer; each parameter becomes a view of its columns.

    The parameters keep their identity (modules, state dicts and `load_state_dict` see the
    same objects), so only where their values are stored changes.
    """
    k = params[0].shape[0]
    flat = torch.cat([p.detach().reshape(k, -1) for p in params], dim=1)
    start = 0
    for p in params:
        width = p[0].numel()
        p.data = flat[:, start : start + width].view(p.shape)
        start += width
    return flat


class PackAdamW:
    """AdamW over stacked (K, ...) parameters with per-model lr, weight decay and step mask.

    The update is torch.optim.AdamW's (moments by lerp and addcmul, decoupled decay, bias
    corrections), with lr and weight decay as (K,) tensors; a masked model is left untouched:
    no parameter, moment or step change. Masking never multiplies a gradient by zero (a
    diverged model's gradient may be NaN and 0 x NaN is NaN): its gradient row is replaced.
    """

    def __init__(self, params: Sequence[nn.Parameter], lr: torch.Tensor, weight_decay: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.flat = flatten_into_rows(self.params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.beta1, self.beta2 = betas
        self.eps = eps
        k = lr.shape[0]
        self.lr_wd = (lr * weight_decay).unsqueeze(1)  # (K, 1): the decoupled decay's step
        self.betas = torch.tensor([[self.beta1, self.beta2]], device=lr.device)  # (1, 2): both bias corrections in one pow
        self.steps = torch.zeros(k, device=lr.device)
        # Constants as tensors: a Python scalar in where/addcmul would cost one operator per step to wrap.
        self._zero = torch.zeros((), device=lr.device)
        self._ones = torch.ones(k, 1, device=lr.device)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)

    def gradients(self) -> torch.Tensor:
        """(K, P): every parameter's gradient in the flat layout (zeros where a parameter has none)."""
        k = self.flat.shape[0]
        return torch.cat([p.grad.reshape(k, -1) if p.grad is not None else torch.zeros_like(p.detach()).reshape(k, -1) for p in self.params], dim=1)

    @torch.no_grad()
    def step(self, active: torch.Tensor, gradients: torch.Tensor | None = None) -> None:
        """One update for the models where `active` (K,) is true; the others keep p, m and v.

        `gradients`: the flat (K, P) gradient with inactive rows already zeroed (a pack's step
        gathers it first for the loss scaler); None: gathered here from the parameters."""
        a = active.to(self.flat.dtype)
        self.steps.add_(a)
        bias = 1 - self.betas ** self.steps.clamp(min=1).unsqueeze(1)  # (K, 2): 1 - beta1^t, 1 - beta2^t
        bias1, bias2 = bias.unbind(1)
        step_size = (self.lr * a / bias1).unsqueeze(1)  # 0 for a masked model
        bias2_sqrt = bias2.sqrt().unsqueeze(1)
        keep = active.unsqueeze(1)
        a = a.unsqueeze(1)
        g = torch.where(keep, self.gradients(), self._zero) if gradients is None else gradients
        self.exp_avg.lerp_(g, a * (1 - self.beta1))  # masked: m + 0 * (0 - m) = m
        self.exp_avg_sq.mul_(torch.rsub(a, 1.0, alpha=1 - self.beta2)).addcmul_(g, g, value=1 - self.beta2)  # masked: v * 1 + 0
        self.flat.mul_(torch.addcmul(self._ones, self.lr_wd, a, value=-1.0))  # 1 - lr * wd (1 for a masked model)
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg * step_size, denom, value=-1.0)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
