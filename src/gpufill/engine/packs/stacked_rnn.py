"""nn.GRU inside a user's model, packed: under vmap, K models' GRUs run as one hand-written batched recurrence.

torch.func.vmap has no batching rule for nn.GRU (`aten::gru` runs one weight set per call), so a pack of a user's
recurrent model either fails or loops over the K models one by one. `batched_recurrences` swaps each plain nn.GRU
of a pack's blueprint for `VmappedGRU`: the same parameters under the same names (functional_call still slices
model k's), whose forward is an autograd.Function with a `vmap` rule. Called once per model it computes one GRU;
called under vmap the rule receives all K models' weights stacked and steps them together: each layer's input
projection one batched matmul before the loop, then `recurrences.gru_layer` (one `baddbmm` per time step for all K,
its backward written out). The math is PyTorch's (gate rows r, z, n; b_hn inside r * (W_hn h + b_hn)), so model k
computes what its own nn.GRU computes, to float rounding; the pack's checked step (`stacked.why_not_stacked`)
compares them before any training trusts it.

What it does not take (a bidirectional or bias-free GRU, an initial hidden state, a PackedSequence, unbatched
input) stays a plain nn.GRU or raises in the checked step: those models train one at a time, with the reason.
nn.LSTM is not swapped yet: its hand-written layer does not return the cell state `(h_n, c_n)` callers read.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.engine.packs.fused import linear
from gpufill.engine.packs.recurrences import gru_layer


def batched_recurrences(model: nn.Module) -> int:
    """Swap every plain, supported nn.GRU in `model` (in place) for a VmappedGRU holding the same parameters; how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.GRU and module.bias and not module.bidirectional:
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], VmappedGRU(module))
            swapped += 1
    return swapped


class VmappedGRU(nn.Module):
    """An nn.GRU's parameters (same names) whose call batches across models under vmap; (output, h_n) as nn.GRU's."""

    def __init__(self, gru: nn.GRU):
        super().__init__()
        self.num_layers, self.batch_first, self.dropout = gru.num_layers, gru.batch_first, float(gru.dropout)
        self.names = [f"{kind}_l{layer}" for layer in range(gru.num_layers) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        for name in self.names:
            setattr(self, name, getattr(gru, name))

    def forward(self, x: Any, hx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if hx is not None:
            raise NotImplementedError("a packed nn.GRU starts from zeros: an initial hidden state is not batched")
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise NotImplementedError("a packed nn.GRU takes a batched (3-D) tensor, not a PackedSequence or one sequence")
        settings = (self.num_layers, self.batch_first, self.dropout if self.training else 0.0)
        return _GRUCall.apply(x, settings, *(getattr(self, name) for name in self.names))


def stacked_gru(x: torch.Tensor, settings: tuple[int, bool, float], weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """K models' GRUs at once: x (K, B, T, I) if batch_first else (K, T, B, I); weights each with a leading K.
    Returns (output, h_n) with a leading K, as each model's nn.GRU lays them out."""
    layers, batch_first, dropout = settings
    h = x.transpose(1, 2) if batch_first else x  # (K, T, B, I): each step one contiguous block per model
    finals = []
    for layer in range(layers):
        w_ih, w_hh, b_ih, b_hh = weights[4 * layer : 4 * layer + 4]
        if layer > 0 and dropout > 0:  # nn.GRU: on every layer's output but the last's (masks drawn for all K)
            h = F.dropout(h, dropout, training=True)
        h = gru_layer(linear(h, w_ih, b_ih), w_hh, b_hh)  # b_hn sits inside r * (W_hn h + b_hn): it stays with w_hh
        finals.append(h[:, -1])
    output = h.transpose(1, 2) if batch_first else h
    return output, torch.stack(finals, dim=1)  # h_n: (K, layers, B, H)


class _GRUCall(torch.autograd.Function):
    """One model's GRU, or (under vmap) all K models' GRUs in one recurrence."""

    @staticmethod
    def forward(x: torch.Tensor, settings: tuple[int, bool, float], *weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output, final = stacked_gru(x.unsqueeze(0), settings, tuple(w.unsqueeze(0) for w in weights))
        return output[0], final[0]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[0], *inputs[2:])
        ctx.settings = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, grad_final: torch.Tensor) -> tuple[Any, ...]:
        # Outside vmap (a blueprint called alone): recompute under autograd; packs take the vmap rule's graph.
        x, *weights = (t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors)
        with torch.enable_grad():
            output, final = _GRUCall.forward(x, ctx.settings, *weights)
            wanted = [t for t in (x, *weights) if t.requires_grad]
            grads = iter(torch.autograd.grad((output, final), wanted, (grad_output, grad_final), allow_unused=True))
        return (next(grads) if x.requires_grad else None, None, *(next(grads) if w.requires_grad else None for w in weights))

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, settings: tuple[int, bool, float],
             *weights: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
        k = info.batch_size

        def stacked(t: torch.Tensor, dim: int | None) -> torch.Tensor:
            return t.unsqueeze(0).expand(k, *t.shape) if dim is None else t.movedim(dim, 0)

        stacked_weights = tuple(stacked(w, d) for w, d in zip(weights, in_dims[2:], strict=True))
        return stacked_gru(stacked(x, in_dims[0]), settings, stacked_weights), (0, 0)
