"""What a training minimises: a named loss applied to `model(inputs)` and the targets, or the
user's own `fn(model, batch) -> Tensor | {"loss": Tensor, **metrics}`.

Either way the loop calls `loss(model, batch)` with the model it prepared (compiled,
DDP-wrapped, under autocast), so every speed-up applies to any loss. A loss is a mean over
its batch; the loop weights it by the batch's sample count. The shape checks and their
messages belong to each named loss: a classifier's speak of classes, a regression's of
targets (for a forecaster: horizons).

This module is the loss registry: `NAMED` (every loss known by name), `REGRESSION` (those a forecaster and a pack
train with) and `SCALE_FREE`; engine/config.py, the campaign file's `loss:`, the CLI's help and messages read the
names from here. Adding a loss is a function or class here and its entry. torch is imported inside the functions, so
a process that only reads the names (the scheduler, `gpufill --help`) imports no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gpufill.engine.choice import Choice
from gpufill.errors import InputError, describe

if TYPE_CHECKING:
    import torch
    from torch import nn

    LossOutput = torch.Tensor | Mapping[str, Any]
    LossFn = Callable[[nn.Module, Any], LossOutput]

_FIX_CALLABLE = "pass loss=fn(model, batch) returning the loss (a mean over the batch), or {'loss': ..., **metrics}"


@dataclass(frozen=True)
class NamedLoss:
    """A loss on `model(inputs)` and the targets of an (inputs, targets) batch."""

    name: ClassVar[str] = ""

    def __call__(self, model: Callable[[Any], Any], batch: Any) -> dict[str, torch.Tensor]:
        import torch

        if not (isinstance(batch, tuple | list) and len(batch) == 2):
            raise InputError(f"loss {self.name!r} takes (inputs, targets) batches, but a batch is {describe(batch)}", field="loss", fix=_FIX_CALLABLE)
        inputs, targets = batch
        output = model(inputs)
        if not isinstance(output, torch.Tensor):
            raise InputError(f"the model returns {describe(output)}, but loss {self.name!r} needs one tensor", field="loss",
                             fix="pass loss=lambda model, batch: ... that picks the loss from the model's outputs (e.g. model(x, y)[1])")
        return self.compute(output, targets)

    def compute(self, output: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def compute_stacked(self, output: torch.Tensor, targets: torch.Tensor, *, shared: bool) -> dict[str, torch.Tensor]:
        """`compute` for K models at once: output (K, b, ...), targets (K, b, ...) or, `shared`, one (b, ...) for all;
        each value (K,). Here `compute` under vmap; a loss overrides it with batched arithmetic where vmap's dispatch
        would cost more than the loss (about 1 ms a step for a K=16 pack on a CPU core)."""
        import torch

        return torch.vmap(self.compute, in_dims=(0, None if shared else 0), randomness="different")(output, targets)

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Regression(NamedLoss):
    """A loss of `REGRESSION` (mse, mae, ...) on outputs shaped like the targets."""

    kind: str = "mse"

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.kind

    def compute(self, output: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        import torch

        if output.shape != self.output_shape(targets.shape):  # host-side shape check: no sync
            per = outputs_per_target(self.kind)
            raise InputError(
                f"the model returns shape {tuple(output.shape)} but targets have shape {tuple(targets.shape)}"
                + (f" (loss {self.kind}: {per} outputs per target)" if per > 1 else ""), field="model",
                fix="make the model's output match the targets' shape (a forecaster: (batch, horizon))" if per == 1 else
                    f"build the model with {per} outputs per target step (a forecaster: horizon x {per}, one per quantile of QUANTILES)")
        if not targets.is_floating_point():
            targets = targets.float()  # integer targets of a regression: the values are what count
        # In fp32 whatever autocast computed (the checks skip no-op dispatches every step).
        output = output if output.dtype == torch.float32 else output.float()
        targets = targets if targets.dtype == torch.float32 else targets.float()
        return {"loss": REGRESSION[self.kind](output, targets)}

    def output_shape(self, targets: tuple[int, ...]) -> tuple[int, ...]:
        """The model output's shape for targets of this shape (the quantile loss: `len(QUANTILES)` per target)."""
        return (*targets[:-1], targets[-1] * outputs_per_target(self.kind)) if targets else targets

    def compute_stacked(self, output: torch.Tensor, targets: torch.Tensor, *, shared: bool) -> dict[str, torch.Tensor]:
        one = targets.shape if shared else targets.shape[1:]
        if output.shape[1:] != self.output_shape(one) or not output.is_floating_point():
            return super().compute_stacked(output, targets, shared=shared)  # compute's own checks and messages
        output, targets = output.float(), targets.float()
        error = REGRESSION[self.kind](output, targets.expand(output.shape[0], *targets.shape) if shared else targets, reduction="none")
        return {"loss": error.flatten(1).mean(dim=1)}


def smape_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Symmetric absolute percentage error, 2|y - f| / (|y| + |f|) (0 where both are 0): scale-free,
    so values must keep their zero (a forecaster's windows scaled by their mean, not standardised).

    The denominator carries no gradient, as in N-BEATS' own sMAPE loss (`forecast.data`): differentiated
    through |f|, the loss is flat at 2 for any forecast of the wrong sign (a network that starts below zero
    never leaves) and flattens as a forecast overshoots, so training drifts high; detached, each value's
    gradient is its absolute error's, weighted by 2 / (|y| + |f|). The value is the same either way."""
    error = 2 * (output - targets).abs() / (output.detach().abs() + targets.abs()).clamp(min=1e-8)
    return error.mean() if reduction == "mean" else error


def mape_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Absolute percentage error, |y - f| / |y| (0 where y is 0, as N-BEATS' `divide_no_nan`): scale-free like
    sMAPE, so values must keep their zero (mean scaling). Its weight 1 / |y| is the data's, so nothing needs
    detaching; it leans the other way from sMAPE (an over-forecast of a small value costs most), which is why
    N-BEATS' ensembles train members on both."""
    import torch

    nonzero = targets != 0  # a divisor of 1 there, not 0: an unchosen inf would still make a nan gradient
    error = (output - targets).abs() / torch.where(nonzero, targets.abs(), 1.0) * nonzero
    return error.mean() if reduction == "mean" else error


def mse_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    from torch.nn import functional

    return functional.mse_loss(output, targets, reduction=reduction)


def mae_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    from torch.nn import functional

    return functional.l1_loss(output, targets, reduction=reduction)


def huber_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    from torch.nn import functional

    return functional.huber_loss(output, targets, reduction=reduction)


QUANTILES = (0.025, 0.1, 0.5, 0.9, 0.975)
"""The quantiles a network trained with `quantile` forecasts, per step: the median (its point forecast) and the bounds
of the central 80 % and 95 % intervals, the levels a forecast's intervals default to (campaign/future/intervals.py)."""


def quantile_loss(output: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The pinball loss of each of `QUANTILES`, averaged: output (..., H x Q), each step's Q quantiles together (step
    h's quantile q at h x Q + q), targets (..., H). Pinball at level tau: tau (y - f) above, (1 - tau) (f - y) below; its
    minimiser is the tau-quantile of y given the window (Koenker & Bassett 1978), so one network learns the median
    and the interval bounds at once (neuralforecast's MQLoss). At tau = 0.5 it is half the absolute error."""
    import torch

    levels = _quantile_levels(output.dtype, output.device)
    error = targets.unsqueeze(-1) - output.unflatten(-1, (targets.shape[-1], len(QUANTILES)))  # (..., H, Q)
    pinball = torch.maximum(levels * error, (levels - 1) * error).flatten(-2)
    return pinball.mean() if reduction == "mean" else pinball


@functools.cache
def _quantile_levels(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """QUANTILES as a tensor, made once per dtype and device: not a host-to-device copy every training step."""
    import torch

    return torch.tensor(QUANTILES, dtype=dtype, device=device)


REGRESSION: dict[str, Callable[..., torch.Tensor]] = {
    "mse": mse_loss,
    "mae": mae_loss,
    "huber": huber_loss,
    "smape": smape_loss,
    "mape": mape_loss,
    "quantile": quantile_loss,
}
"""The regression losses by name, each `fn(output, targets, reduction="mean" | "none")`: what `fit` takes by name, a
forecaster's recipe and a campaign file's `loss:` may name, and a fused pack trains (per sample, masked)."""
SCALE_FREE = ("smape", "mape")
"""Percentages of the value: they need values whose zero is the series' zero (a forecaster's mean scaling)."""
MULTI_OUTPUT = {"quantile": len(QUANTILES)}
"""Losses whose model gives several outputs per target (step-major: a target's outputs side by side)."""


def outputs_per_target(loss: object) -> int:
    """How many outputs a model trained with `loss` gives per target (1 but for `MULTI_OUTPUT`'s)."""
    return MULTI_OUTPUT.get(loss, 1) if isinstance(loss, str) else 1


def stand_in_errors(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each output's squared distance to its target (..., N, outputs per target): the loss a measured step (a pack's
    size, whether vmap runs a model) trains on whatever the training's loss, of the same cost, for a model of one
    output per target or of several (a quantile network's)."""
    return (output.unflatten(-1, (targets.shape[-1], -1)) - targets.unsqueeze(-1)).pow(2)


def per_sample_regression(kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(...,) loss of each sample, the mean over its last dimension: what a fused pack masks and
    averages per model (the mean of these over a batch is the named loss)."""
    return REGRESSION[kind](output, targets, reduction="none").mean(dim=-1)


def top1_hits(scores: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor, *, dim: int) -> torch.Tensor:
    """Whether each counted label's score is above every other class's along `dim` (a tie is not a hit).

    The label's score is picked, replaced by -inf, the row's max taken, and the score put back: three vectorised passes
    where `argmax` takes one scalar pass 4x slower on a CPU. In place where the scores own their memory (on a byte-level
    language model's fresh (4096, 256) logits 0.5 ms against 1.6-1.8 ms with a copy, of a ~50 ms step on 2 cores): through `.data`, so autograd
    never sees it, and put back bit for bit before anything else runs. Equal to `argmax == label` except at exact
    ties, which argmax breaks by index."""
    import torch

    with torch.no_grad():
        index = torch.where(counted, labels, 0).unsqueeze(dim)  # ignored labels (-100) index nothing
        if not _writable_in_place(scores):
            picked = scores.gather(dim, index)
            others = scores.scatter(dim, index, float("-inf")).amax(dim=dim, keepdim=True)
            return (picked > others).squeeze(dim) & counted
        raw = scores.data  # no version bump: a saved output (an exp's, a user's) stays valid for backward
        picked = raw.gather(dim, index)
        raw.scatter_(dim, index, float("-inf"))
        try:
            others = raw.amax(dim=dim, keepdim=True)
        finally:
            raw.scatter_(dim, index, picked)
        return (picked > others).squeeze(dim) & counted


def _writable_in_place(scores: torch.Tensor) -> bool:
    """A plain contiguous tensor: no element shares memory with another (an expanded view's rows would), and no
    functorch wrapper (a pack's loss under vmap) stands between `.data` and the memory."""
    import torch

    return scores.is_contiguous() and not torch._C._functorch.is_functorch_wrapped_tensor(scores)


@dataclass(frozen=True)
class CrossEntropy(NamedLoss):
    """Class scores (batch, classes) against integer labels (batch,); a language model's
    (batch, positions, vocabulary) against (batch, positions); or class probabilities of the
    scores' shape. Adds `accuracy` (over labels not equal to ignore_index)."""

    name: ClassVar[str] = "cross_entropy"
    ignore_index: int = -100
    label_smoothing: float = 0.0

    def compute(self, output: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        from torch import nn

        if targets.is_floating_point() and targets.shape == output.shape:  # class probabilities
            loss = nn.functional.cross_entropy(output.float(), targets.float(), label_smoothing=self.label_smoothing)
            return {"loss": loss}
        if targets.is_floating_point():
            raise InputError(f"cross_entropy needs integer class labels, but the targets are {str(targets.dtype).removeprefix('torch.')}",
                             field="loss", fix="pass labels as a long tensor (y.long()), or class probabilities of the scores' shape")
        if output.dim() == targets.dim() + 1 and output.shape[:-1] == targets.shape:
            scores, labels = output.reshape(-1, output.shape[-1]), targets.reshape(-1)  # classes last: (batch, ..., classes)
        elif output.dim() == targets.dim() + 1 and output.shape[:1] + output.shape[2:] == targets.shape:
            scores, labels = output, targets  # torch's own layout: (batch, classes, ...)
        else:
            classes = output.shape[-1] if output.dim() > 1 else 1
            raise InputError(
                f"the model returns scores of shape {tuple(output.shape)} ({classes} classes) but the labels have shape {tuple(targets.shape)}",
                field="model", fix=f"return one score per class, (batch, classes), for labels of shape (batch,): e.g. {tuple(targets.shape[:1]) + (classes,)}")
        loss = nn.functional.cross_entropy(scores.float(), labels, ignore_index=self.ignore_index, label_smoothing=self.label_smoothing)
        counted = labels != self.ignore_index
        hits = top1_hits(scores, labels, counted, dim=-1 if scores.dim() == 2 else 1)
        return {"loss": loss, "accuracy": hits.sum() / counted.sum().clamp(min=1)}

    def compute_stacked(self, output: torch.Tensor, targets: torch.Tensor, *, shared: bool) -> dict[str, torch.Tensor]:
        from torch import nn

        k = output.shape[0]
        labels = targets.expand(k, *targets.shape) if shared else targets
        if targets.is_floating_point() or output.dim() != labels.dim() + 1 or output.shape[:-1] != labels.shape:
            return super().compute_stacked(output, targets, shared=shared)  # probabilities, torch's (batch, classes, ...) layout, errors
        scores, flat = output.reshape(-1, output.shape[-1]).float(), labels.reshape(-1)
        each = nn.functional.cross_entropy(scores, flat, ignore_index=self.ignore_index, label_smoothing=self.label_smoothing, reduction="none")
        counted = (labels != self.ignore_index).reshape(k, -1)
        hits = top1_hits(scores, flat, counted.view(-1), dim=-1).view(k, -1)
        per_model = counted.sum(dim=1)
        # torch's mean over the labels it counts (all but ignore_index); accuracy over the same, per model
        return {"loss": each.view(k, -1).sum(dim=1) / per_model, "accuracy": hits.sum(dim=1) / per_model.clamp(min=1)}

    def describe(self) -> str:
        extras = [f"ignore_index={self.ignore_index}"] if self.ignore_index != -100 else []
        extras += [f"label_smoothing={self.label_smoothing}"] if self.label_smoothing else []
        return f"cross_entropy({', '.join(extras)})" if extras else "cross_entropy"


@dataclass(frozen=True)
class BCEWithLogits(NamedLoss):
    """One logit per target (0/1 or a probability); (batch, 1) outputs also match (batch,) targets.
    Adds `accuracy` at logit 0 (probability 0.5)."""

    name: ClassVar[str] = "bce_with_logits"
    pos_weight: float | None = None

    def compute(self, output: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        import torch

        if output.dim() == targets.dim() + 1 and output.shape[-1] == 1:
            output = output.squeeze(-1)
        if output.shape != targets.shape:
            raise InputError(f"the model returns {tuple(output.shape)} logits but the labels have shape {tuple(targets.shape)}", field="model",
                             fix="return one logit per label: (batch,) or (batch, 1) for one label per sample")
        targets = targets.float()
        weight = torch.tensor(self.pos_weight, device=output.device) if self.pos_weight is not None else None
        loss = torch.nn.functional.binary_cross_entropy_with_logits(output.float(), targets, pos_weight=weight)
        return {"loss": loss, "accuracy": ((output > 0) == (targets > 0.5)).float().mean()}


NAMED: dict[str, NamedLoss] = {
    **{name: Regression(name) for name in REGRESSION},
    "cross_entropy": CrossEntropy(),
    "bce_with_logits": BCEWithLogits(),
}
"""Every loss `fit` knows by name: help lines and messages list these."""


class _UserLoss:
    """The user's `fn(model, batch)`, its output checked and made a dict."""

    def __init__(self, fn: LossFn):
        self.fn = fn
        self.checked = False

    def __call__(self, model: Callable[[Any], Any], batch: Any) -> dict[str, torch.Tensor]:
        out = self.fn(model, batch)  # type: ignore[arg-type]
        values = dict(out) if isinstance(out, Mapping) else {"loss": out}
        if not self.checked:  # host-side checks once: shapes and types do not change between steps
            _check_output(values, self.fn)
            self.checked = True
        return values


def _check_output(values: dict[str, Any], fn: Any) -> None:
    import torch

    name = getattr(fn, "__qualname__", type(fn).__name__)
    loss = values.get("loss")
    if not isinstance(loss, torch.Tensor):
        raise InputError(f"loss function {name} returned {'a dict without a loss' if 'loss' not in values else type(loss).__name__}",
                         field="loss", fix=_FIX_CALLABLE)
    if loss.dim() != 0:
        raise InputError(f"loss function {name} returned a loss of shape {tuple(loss.shape)}", field="loss",
                         fix="return one number: the mean over the batch (e.g. loss.mean())")
    for key, value in values.items():
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise InputError(f"loss function {name} returned metric {key!r} as {type(value).__name__}"
                             + (f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""),
                             field="loss", fix="return each metric as a 0-dimensional tensor (a mean over the batch), kept on the device")


def resolve(loss: Any) -> tuple[Callable[[Any, Any], dict[str, torch.Tensor]], Choice[str]]:
    """The loss as `fn(model, batch) -> {"loss": ..., **metrics}`, and the plan's record of it."""
    if isinstance(loss, str):
        if loss not in NAMED:
            raise InputError(f"unknown loss {loss!r}", field="loss", fix=f"use one of {', '.join(NAMED)}, or a function fn(model, batch)")
        return NAMED[loss], Choice(loss, f"named loss on model(inputs) and targets{_METRIC_NOTE.get(loss, '')}")
    if isinstance(loss, NamedLoss):
        return loss, Choice(loss.describe(), f"named loss on model(inputs) and targets{_METRIC_NOTE.get(loss.name, '')}")
    if callable(loss):
        name = getattr(loss, "__qualname__", type(loss).__name__)
        return _UserLoss(loss), Choice(name, "your loss function, called as fn(model, batch) with the prepared model (compile, DDP, autocast applied)")
    raise InputError(f"loss must be a name or a function, got {type(loss).__name__}", field="loss",
                     fix=f"use one of {', '.join(NAMED)}, or a function fn(model, batch)")


_METRIC_NOTE = {"cross_entropy": "; reports accuracy", "bce_with_logits": "; reports accuracy"}

