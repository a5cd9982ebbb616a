"""A pack's optimizer: AdamW over K stacked models, each with its own lr, weight decay and step
count. Two of them, for two ways of knowing which models step:

- `PackAdamW`: a (K,) mask on the device, so a model that is stopped, diverged, out of samples
  or (fp16) overflowed this step is left untouched without reading the device (campaign packs,
  their captured CUDA graph, fp16 loss scaling: `engine.precision.Precision`). Every parameter
  lives in one flat (K, P) buffer (the module's parameters become views into it), and so do
  the moments: about twenty operators for the whole pack however many tensors the model has.
- `StackedAdam`: which models step is known on the host (fit_many: a model stops at an epoch's
  end), so torch's own Adam or AdamW kernel steps them, over whole stacks where the models agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.optim.adam import adam
from torch.optim.adamw import adamw

from gpufill.engine.hardware import fused_optimizer_devices


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

    Step for step the arithmetic of torch.optim.AdamW as `fit` uses it, so a packed model ends
    where the same model trained alone ends, to float rounding: the bias corrections in float64
    (torch computes them on the host in double), moments by lerp and addcmul, the update as
    addcdiv's (value x exp_avg) / denom, and decoupled decay only on weight matrices and
    embeddings (parameters of two or more dimensions per model), as `fit`'s AdamW groups it.
    lr and weight decay are (K,) tensors; a masked model is left untouched: no parameter,
    moment or step change. Masking never multiplies a gradient by zero (a diverged model's
    gradient may be NaN and 0 x NaN is NaN): its gradient row is replaced.
    """

    def __init__(self, params: Sequence[nn.Parameter], lr: torch.Tensor, weight_decay: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 *, decoupled: bool = True):
        self.params = list(params)
        self.flat = flatten_into_rows(self.params)
        self.decoupled = decoupled
        """False: Adam's L2 penalty (wd x p added to the gradient of every parameter), as fit's `adam` builds it."""
        device = lr.device
        self.base_lr = lr.detach().to(torch.float64).clone()
        self.lr = self.base_lr.clone()
        """(K,) float64: the base lr times the schedule's factor (`set_lr_factor`)."""
        self.weight_decay = weight_decay.detach().to(torch.float64)
        self.beta1, self.beta2 = betas
        self.eps = eps
        k = lr.shape[0]
        self.decays = bool((self.weight_decay != 0).any())
        # (1, P): 1 on the columns of weight matrices and embeddings, 0 on biases and norm weights (AdamW); 1 everywhere (Adam).
        self.decay_columns = torch.cat([torch.full((p[0].numel(),), float(p[0].dim() >= 2 or not decoupled), device=device)
                                        for p in self.params]).unsqueeze(0)
        self.betas = torch.tensor([[self.beta1, self.beta2]], device=device, dtype=torch.float64)  # (1, 2): both corrections in one pow
        self.steps = torch.zeros(k, device=device, dtype=torch.float64)
        # Constants as tensors: a Python scalar in where/addcmul would cost one operator per step to wrap.
        self._zero = torch.zeros((), device=device)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)

    def set_lr_factor(self, factor: float | torch.Tensor) -> None:
        """Every model's lr = its base lr x `factor` (a schedule's multiplier for the next step; (K,): each model's own)."""
        torch.mul(self.base_lr, factor, out=self.lr)

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors a step changes besides the parameters (a probe puts them back; a re-formed pack copies them):
        a schedule's lr too."""
        return [self.steps, self.lr, self.exp_avg, self.exp_avg_sq]

    def gradients(self) -> torch.Tensor:
        """(K, P): every parameter's gradient in the flat layout (zeros where a parameter has none)."""
        k = self.flat.shape[0]
        return torch.cat([p.grad.reshape(k, -1) if p.grad is not None else torch.zeros_like(p.detach()).reshape(k, -1) for p in self.params], dim=1)

    @torch.no_grad()
    def step(self, active: torch.Tensor, gradients: torch.Tensor | None = None) -> None:
        """One update for the models where `active` (K,) is true; the others keep p, m and v.

        `gradients`: the flat (K, P) gradient with inactive rows already zeroed (a pack's step
        gathers it first for the loss scaler); None: gathered here from the parameters."""
        a64 = active.to(torch.float64)
        self.steps.add_(a64)
        bias = 1 - self.betas ** self.steps.clamp(min=1).unsqueeze(1)  # (K, 2) float64: 1 - beta1^t, 1 - beta2^t
        bias1, bias2 = bias.unbind(1)
        step_size = (self.lr * a64 / bias1).to(self.flat.dtype).unsqueeze(1)  # 0 for a masked model
        bias2_sqrt = bias2.sqrt().to(self.flat.dtype).unsqueeze(1)
        keep = active.unsqueeze(1)
        a = a64.to(self.flat.dtype).unsqueeze(1)
        g = torch.where(keep, self.gradients(), self._zero) if gradients is None else gradients
        if self.decays and not self.decoupled:  # Adam's L2 term, wd x p, on active models' gradients (0 for a masked one)
            g = g + (self.weight_decay * a64).to(self.flat.dtype).unsqueeze(1) * self.flat
        elif self.decays:  # 1 - lr x wd on decayed columns of active models, 1 elsewhere
            decay = (self.lr * self.weight_decay * a64).to(self.flat.dtype).unsqueeze(1)
            self.flat.mul_(1 - decay * self.decay_columns)
        self.exp_avg.lerp_(g, a * (1 - self.beta1))  # masked: m + 0 * (g - m) = m
        self.exp_avg_sq.mul_(torch.where(keep, self.beta2, 1.0)).addcmul_(g, g, value=1 - self.beta2)  # masked: v * 1 + 0
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg * step_size, denom, value=-1.0)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None



class PackSGD:
    """SGD with momentum over stacked (K, ...) parameters with per-model lr, weight decay and step mask: the
    arithmetic of torch.optim.SGD as `fit`'s `sgd` builds it (momentum 0.9, no dampening, L2 weight decay on every
    parameter; the first step's buffer is the gradient itself). The same interface and flat (K, P) layout as
    PackAdamW; a masked model keeps its parameters and buffer."""

    def __init__(self, params: Sequence[nn.Parameter], lr: torch.Tensor, weight_decay: torch.Tensor, momentum: float = 0.9):
        self.params = list(params)
        self.flat = flatten_into_rows(self.params)
        device = lr.device
        self.base_lr = lr.detach().to(torch.float64).clone()
        self.lr = self.base_lr.clone()
        self.weight_decay = weight_decay.detach().to(torch.float64)
        self.decays = bool((self.weight_decay != 0).any())
        self.momentum = momentum
        self.steps = torch.zeros(lr.shape[0], device=device, dtype=torch.float64)
        self._zero = torch.zeros((), device=device)
        self.buffer = torch.zeros_like(self.flat)

    set_lr_factor = PackAdamW.set_lr_factor
    gradients = PackAdamW.gradients
    zero_grad = PackAdamW.zero_grad

    def state_tensors(self) -> list[torch.Tensor]:
        return [self.steps, self.lr, self.buffer]

    @torch.no_grad()
    def step(self, active: torch.Tensor, gradients: torch.Tensor | None = None) -> None:
        """One update for the models where `active` (K,) is true; the others keep p and their buffer."""
        keep = active.unsqueeze(1)
        a64 = active.to(torch.float64)
        g = torch.where(keep, self.gradients(), self._zero) if gradients is None else gradients
        if self.decays:
            g = g + (self.weight_decay * a64).to(self.flat.dtype).unsqueeze(1) * self.flat
        first = (keep & (self.steps == 0).unsqueeze(1))  # torch starts the buffer as the gradient itself
        moved = torch.where(first, g, self.buffer * self.momentum + g)
        self.buffer.copy_(torch.where(keep, moved, self.buffer))  # in place: a captured CUDA graph replays into the same memory
        self.steps.add_(a64)
        self.flat.sub_((self.lr * a64).to(self.flat.dtype).unsqueeze(1) * self.buffer)


PACK_OPTIMIZERS = ("adamw", "adam", "sgd")
"""fit's named optimizers a campaign pack steps itself (device-side masks, one flat buffer)."""


def pack_optimizer(name: str, params: Sequence[nn.Parameter], lr: torch.Tensor, weight_decay: torch.Tensor) -> PackAdamW | PackSGD:
    """The pack's optimizer for fit's named optimizer `name` (PACK_OPTIMIZERS)."""
    if name == "sgd":
        return PackSGD(params, lr, weight_decay)
    return PackAdamW(params, lr, weight_decay, decoupled=name == "adamw")


class StackedAdam:
    """torch's Adam (L2 penalty) or AdamW (decoupled decay) for K stacked models (contiguous (K, ...) leaves) when
    which models step is known on the host (fit_many: a model stops at an epoch's end, never mid-epoch).

    Each model keeps its own lr, weight decay and step counts; as `fit` builds them, AdamW decays weight matrices
    and embeddings only and Adam penalises every parameter. One call of torch's kernel (fused on CPU and CUDA, called
    directly: no Python optimizer loop per step) per run of consecutive models that share lr, weight decay and step
    count: for variants that differ only in seed that is one call over the whole stack, as PyTorch's own vmap
    ensemble steps it; a model alone in its group is a run of one. The arithmetic is the kernel's, the very one
    `fit` runs for each model alone.
    """

    def __init__(self, params: Sequence[nn.Parameter], lr: Sequence[float], weight_decay: Sequence[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, *, decoupled: bool = True):
        self.params = list(params)
        self.k = k = self.params[0].shape[0]
        if len(lr) != k or len(weight_decay) != k:
            raise ValueError(f"{len(lr)} lrs and {len(weight_decay)} weight decays for {k} models")
        device = self.params[0].device
        self.fused = device.type in fused_optimizer_devices() and all(p.is_floating_point() for p in self.params)
        self.decoupled = decoupled
        self.base_lr, self.lr, self.weight_decay = list(lr), list(lr), list(weight_decay)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.steps = torch.zeros(k, len(self.params), device=device)
        """(K, parameters) float32 on the device: what torch's kernel reads; `counts` is the host's copy."""
        self.counts = [0] * k
        # fit's AdamW decays weight matrices and embeddings; its Adam's L2 penalty falls on every parameter.
        self.decayed = [j for j, p in enumerate(self.params) if p[0].dim() >= 2 or not decoupled]
        self.not_decayed = [j for j, p in enumerate(self.params) if j not in self.decayed]

    def set_lr_factor(self, factor: float) -> None:
        """Every model's lr = its base lr x `factor` (a schedule's multiplier for the next step)."""
        self.lr = [lr * factor for lr in self.base_lr]

    @torch.no_grad()
    def step(self, models: Sequence[int]) -> None:
        """One update of the models at `models` (ascending indices). A parameter without a gradient
        is skipped for every model this step (torch skips it too), its step count with it."""
        grads = [None if p.grad is None else p.grad.contiguous() for p in self.params]
        present = [j for j, g in enumerate(grads) if g is not None]
        if not present or not models:
            return
        if len(models) == self.k and len(present) == len(self.params):
            self.steps.add_(1.0)
        else:
            mask = torch.zeros(self.k, len(self.params))
            mask[torch.tensor(list(models))[:, None], torch.tensor(present)[None, :]] = 1.0
            self.steps.add_(mask.to(self.steps.device))
        for k in models:
            self.counts[k] += 1
        for a, b in self._runs(models):
            lr, weight_decay = self.lr[a], self.weight_decay[a]
            for columns, decay in ((self.decayed, weight_decay), (self.not_decayed, 0.0)) if weight_decay else ((present, 0.0),):
                js = [j for j in columns if grads[j] is not None]
                if js:
                    self._kernel([self.params[j].detach()[a:b] for j in js], [grads[j][a:b] for j in js],  # type: ignore[index]
                                 [self.exp_avg[j][a:b] for j in js], [self.exp_avg_sq[j][a:b] for j in js],
                                 [self.steps[a, j] for j in js], lr=lr, weight_decay=decay)

    def _runs(self, models: Sequence[int]) -> list[tuple[int, int]]:
        """[a, b) ranges of consecutive models sharing lr, weight decay and step count."""
        runs: list[tuple[int, int]] = []
        for k in models:
            if runs and runs[-1][1] == k and self._same(runs[-1][0], k):
                runs[-1] = (runs[-1][0], k + 1)
            else:
                runs.append((k, k + 1))
        return runs

    def _same(self, a: int, b: int) -> bool:
        return self.lr[a] == self.lr[b] and self.weight_decay[a] == self.weight_decay[b] and self.counts[a] == self.counts[b]

    def _kernel(self, params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                steps: list[torch.Tensor], *, lr: float, weight_decay: float) -> None:
        """torch's Adam or AdamW update of contiguous tensors whose step counts are already advanced: its fused
        kernel where this torch has one for the device (it reads the step, never adds to it), else
        its foreach implementation (which adds one itself: taken back first)."""
        if self.fused:
            kernel = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
            kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=self.beta1, beta2=self.beta2,
                   weight_decay=weight_decay, eps=self.eps, maximize=False)
            return
        steps = [s.clone() - 1 for s in steps]
        (adamw if self.decoupled else adam)(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, amsgrad=False, beta1=self.beta1,
                                            beta2=self.beta2, lr=lr, weight_decay=weight_decay, eps=self.eps, maximize=False)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
