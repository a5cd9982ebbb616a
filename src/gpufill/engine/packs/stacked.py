"""Packs of any architecture, through torch.func: K models of one class and shape, their parameters
and buffers stacked along a leading model dimension, run as one `torch.vmap(functional_call)`.

This is PyTorch's model-ensembling recipe (`stack_module_state` + `functional_call` under
`vmap`) made trainable: the stacked tensors are ordinary leaf parameters, so one backward of
the summed per-model losses gives each model its own gradient (the losses are independent),
and `PackAdamW` steps them as one flat (K, P) buffer.

vmap has no batching rule for some modules (nn.LSTM; nn.GRU is swapped for a batched recurrence, `stacked_rnn.py`)
and some code cannot run under it
at all (`.item()`, data-dependent Python control flow): `why_not_stacked` runs one checked step
and compares it with the same model run alone, so a module that fails or disagrees is trained
unfused with the reason, never packed into a wrong result. BatchNorm in training mode batches
correctly here: each model's running statistics are its own stacked buffer.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from gpufill.engine.losses import NamedLoss, stand_in_errors
from gpufill.engine.packs.direct import direct_forward
from gpufill.engine.packs.fused import FusedModule, can_fuse, fuse
from gpufill.engine.packs.stacked_rnn import batched_recurrences

# vmap over an op without a batching rule (the CPU's flash attention, in a transformer pack) runs it model by model and
# says "performance drop ... please file us an issue". A pack's kind and size are measured against training one model at
# a time (engine/packs/size.py), so that cost is already weighed where it matters: the note is noise in a user's output.
warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule", category=UserWarning)

# The checked step's tolerance: model 0 run in the pack against the same model run alone (fp32).
CHECK_TOLERANCE = 1e-4


class _LossCall(nn.Module):
    """`fn(model, batch)` as a module, so functional_call swaps the model's parameters for one
    model's slice of the stack and the user's function sees a real module (attributes, submodules)."""

    def __init__(self, model: nn.Module, fn: Callable[[Any, Any], Any]):
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, batch: Any) -> Any:
        return self.fn(self.model, batch)


class StackedModule(FusedModule):
    """K copies of one module: stacked (K, ...) parameters and buffers, called through vmap.

    `forward(*inputs)` takes inputs with a leading K (each model its own data) like the
    hand-written fused modules; `per_model(fn, batch)` calls `fn(model_k, batch_k)` for every k.
    """

    def __init__(self, template: nn.Module, k: int, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]):
        super().__init__(template, k)
        self._base = (copy.deepcopy(template),)  # the blueprint functional_call runs: its own tensors are never read
        batched_recurrences(self.base)  # nn.GRU has no batching rule: its K calls become one batched recurrence
        self._calls: dict[Any, _LossCall] = {}
        """`fn(model, batch)` wrapped as a module around the blueprint, per loss function (its mode is the blueprint's)."""
        self.param_names = list(params)
        self.buffer_names = list(buffers)
        self.weights = nn.ParameterList([nn.Parameter(params[name].detach().clone()) for name in self.param_names])
        self.direct = direct_forward(template)
        """The forward without vmap where the model is a chain of recognised layers (packs/direct.py), else None."""
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"buffer_{i}", buffers[name].detach().clone())

    @classmethod
    def from_models(cls, models: Sequence[nn.Module]) -> StackedModule:
        params, buffers = stack_module_state(list(models))
        stacked = cls(models[0], len(models), params, buffers)
        return stacked.to(next(models[0].parameters()).device)

    def to(self, *args: Any, **kwargs: Any) -> StackedModule:  # type: ignore[override]
        super().to(*args, **kwargs)
        self._base = (self._base[0].to(*args, **kwargs),)
        self._calls.clear()
        return self

    @property
    def base(self) -> nn.Module:
        return self._base[0]

    def stacked_state(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The plain names -> the (K, ...) tensors functional_call takes."""
        state = {prefix + name: p for name, p in zip(self.param_names, self.weights, strict=True)}
        state.update({prefix + name: getattr(self, f"buffer_{i}") for i, name in enumerate(self.buffer_names)})
        return state

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.direct is not None and len(inputs) == 1:
            return self.direct(self.stacked_state(), inputs[0])

        def one(state: dict[str, torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
            return functional_call(self.base, state, args)

        return torch.vmap(one, randomness="different")(self.stacked_state(), *inputs)

    def per_model(self, fn: Callable[[Any, Any], Any], batch: Any, *, shared_batch: bool = False) -> Any:
        """`fn(model_k, batch_k)` for every model k, outputs stacked along a leading K.
        `shared_batch`: every model sees the same `batch` (validation). A named loss of a model with a direct forward
        runs the model without vmap and only the loss's arithmetic under it."""
        if self.direct is not None and isinstance(fn, NamedLoss) and isinstance(batch, tuple | list) and len(batch) == 2:
            inputs, targets = batch
            output = self.direct(self.stacked_state(), inputs.expand(self.k, *inputs.shape) if shared_batch else inputs)
            return fn.compute_stacked(output, targets, shared=shared_batch)
        call = self._calls.get(fn)
        if call is None:  # one wrapper per loss function: building a module (and setting its mode) every step costs ~50 us
            call = self._calls[fn] = _LossCall(self.base, fn)

        def one(state: dict[str, torch.Tensor], data: Any) -> Any:
            return functional_call(call, state, (data,))

        return torch.vmap(one, in_dims=(0, None if shared_batch else 0), randomness="different")(self.stacked_state("model."), batch)

    def train(self, mode: bool = True) -> StackedModule:
        super().train(mode)
        self.base.train(mode)
        return self

    def unfuse(self, k: int) -> nn.Module:
        """A plain model holding model k's current weights and buffers."""
        return self.write_into(k, copy.deepcopy(self.base))

    def write_into(self, k: int, model: nn.Module) -> nn.Module:
        """`model` (of the pack's structure, e.g. the one model k was stacked from) given model k's current weights,
        buffers and mode; no copy of the module itself."""
        state = self.stacked_state()
        with torch.no_grad():
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
                tensor.copy_(state[name][k])
        return model.train(self.training)


def why_not_stacked(models: Sequence[nn.Module], fn: Callable[[Any, Any], Any], batch: Any, *,
                    device: torch.device | None = None) -> str | None:
    """None when `models` train correctly as a StackedModule; else why not, in a few words.

    One checked training step on `batch`, on copies (the models are left as they were), with
    dropout's probability at 0 (a pack draws each model's masks apart): model 0's loss and
    gradients in a pack of two must equal its own alone. Dropout the check cannot switch off
    (a functional call with a fixed p) makes them differ: trained one at a time, never wrong.
    `device`: where the copies are checked (the batch must be there already); default where the models are.
    """
    if len({type(m) for m in models}) != 1:
        return "the models are of different classes"
    shapes = {tuple((name, tuple(t.shape), t.dtype) for name, t in [*m.named_parameters(), *m.named_buffers()]) for m in models}
    if len(shapes) != 1:
        return "the models' parameters differ in shape"
    copies = [_without_dropout(copy.deepcopy(m).train()) for m in (models[0], models[min(1, len(models) - 1)], models[0])]
    if device is not None:
        copies = [c.to(device) for c in copies]
    try:
        stacked = StackedModule.from_models(copies[:2]).train()
        packed_loss = _loss_of(stacked.per_model(fn, _repeat(batch, 2)))
        packed_loss.sum().backward()
    except Exception as error:  # noqa: BLE001 - whatever vmap cannot run is a reason, not a crash
        return f"torch.vmap cannot run it ({type(error).__name__}: {_first_line(error)})"
    alone = copies[2]
    try:
        single_loss = _loss_of(fn(alone, batch))
        single_loss.backward()
    except Exception as error:  # noqa: BLE001
        return f"the model alone failed the checked step ({type(error).__name__}: {_first_line(error)})"
    if not torch.allclose(packed_loss[0].detach(), single_loss.detach(), rtol=CHECK_TOLERANCE, atol=CHECK_TOLERANCE):
        return f"in a pack its loss is {float(packed_loss[0]):.6g}, alone {float(single_loss):.6g} (randomness or state vmap does not batch)"
    packed_grads = dict(zip(stacked.param_names, stacked.weights, strict=True))
    for name, p in alone.named_parameters():
        mine = packed_grads[name].grad
        mine = torch.zeros_like(p) if mine is None else mine[0]
        theirs = torch.zeros_like(p) if p.grad is None else p.grad
        if not torch.allclose(mine, theirs, rtol=1e-3, atol=CHECK_TOLERANCE):
            return f"in a pack the gradient of {name} differs from the model's own alone"
    return None


def _without_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        elif isinstance(module, nn.MultiheadAttention | nn.RNNBase):
            module.dropout = 0.0
    return model


def _loss_of(output: Any) -> torch.Tensor:
    if isinstance(output, dict):
        return output["loss"]
    return output


def _repeat(batch: Any, k: int) -> Any:
    from gpufill.engine.batches import map_tensors

    return map_tensors(lambda leaf: leaf.unsqueeze(0).expand(k, *leaf.shape).contiguous(), batch)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else ""


HAND_WRITTEN = "hand-written fused kernels"
VMAP = "torch.func vmap"


def pack_module(models: Sequence[nn.Module], kind: str | None = None) -> FusedModule:
    """One pack of `models` of `kind` (None: their hand-written fused kernel where one is registered, else the torch.func stack)."""
    return fuse(models) if (kind or pack_kind(models[0])) == HAND_WRITTEN else StackedModule.from_models(models)


def pack_kind(model: nn.Module) -> str:
    """The kind a pack of `model` is by default: hand-written where registered (vmap cannot batch nn.LSTM/nn.GRU)."""
    return HAND_WRITTEN if can_fuse(model) else VMAP


def pack_kinds(build: Callable[[], nn.Module], sample: Any) -> list[str]:
    """The kinds of pack `build()`'s models can train as, the default first: a registered model's
    hand-written kernels and, where one checked step shows vmap runs it correctly, the torch.func stack."""
    first = build()
    if not can_fuse(first):
        return [VMAP]
    if any(isinstance(m, nn.RNNBase) for m in first.modules()):
        return [HAND_WRITTEN]  # the stack would run the same hand-written recurrence (stacked_rnn.py), or could not batch it
    return [HAND_WRITTEN] if why_not_stacked([first, build()], _stand_in, sample) is not None else [HAND_WRITTEN, VMAP]


def _stand_in(model: nn.Module, batch: Any) -> torch.Tensor:
    return stand_in_errors(model(batch[0]), batch[1]).mean()


def why_not_packed(build: Callable[[], nn.Module], loss: Callable[[Any, Any], Any], sample: Any) -> str | None:
    """None when models from `build()` can train as a pack (hand-written or stacked); else why not."""
    first = build()
    if can_fuse(first):
        return None
    return why_not_stacked([first, build()], loss, sample)
