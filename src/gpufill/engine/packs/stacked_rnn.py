"""nn.GRU and nn.LSTM inside a user's model, packed: under vmap, K models' recurrent layers run as one hand-written
batched recurrence.

torch.func.vmap has no batching rule for nn.GRU or nn.LSTM (`aten::gru`/`aten::lstm` run one weight set per call), so
a pack of a user's recurrent model either fails or loops over the K models one by one. `batched_recurrences` swaps
each plain nn.GRU / nn.LSTM of a pack's blueprint for `VmappedGRU` / `VmappedLSTM`: the same parameters under the same
names (functional_call still slices model k's), whose forward is an autograd.Function with a `vmap` rule. Called once
per model it computes one layer stack; called under vmap the rule receives all K models' weights stacked and steps
them together: each layer's input projection one batched matmul before the loop, then `recurrences.gru_layer` /
`lstm_layer_and_cell` (one `baddbmm` per time step for all K, the backward written out). The math is PyTorch's (GRU
gate rows r, z, n with b_hn inside r * (W_hn h + b_hn); LSTM rows i, f, g, o, both biases added, c_n returned with its
gradient), so model k computes what its own layer computes, to float rounding; the pack's checked step
(`stacked.why_not_stacked`) compares them before any training trusts it.

What it does not take (a bidirectional or bias-free layer, an LSTM with proj_size, an initial state, a
PackedSequence, unbatched input) stays the plain torch layer or raises in the checked step: those models train one at
a time, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.engine.packs.fused import linear
from gpufill.engine.packs.recurrences import gru_layer, lstm_layer_and_cell, oifg


def batched_recurrences(model: nn.Module) -> int:
    """Swap every plain, supported nn.GRU / nn.LSTM in `model` (in place) for its vmapped twin holding the same
    parameters; how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        twin: nn.Module | None = None
        if type(module) is nn.GRU and module.bias and not module.bidirectional:
            twin = VmappedGRU(module)
        elif type(module) is nn.LSTM and module.bias and not module.bidirectional and module.proj_size == 0:
            twin = VmappedLSTM(module)
        if twin is not None:
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], twin)
            swapped += 1
    return swapped


class _VmappedRecurrent(nn.Module):
    """A torch recurrent layer's parameters (same names), called through an autograd.Function with a vmap rule."""

    kind = "nn.RNN"

    def __init__(self, rnn: nn.RNNBase):
        super().__init__()
        self.num_layers, self.batch_first, self.dropout = rnn.num_layers, rnn.batch_first, float(rnn.dropout)
        self.names = [f"{kind}_l{layer}" for layer in range(rnn.num_layers) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        for name in self.names:
            setattr(self, name, getattr(rnn, name))

    def _settings(self, x: Any, hx: Any) -> tuple[int, bool, float]:
        if hx is not None:
            raise NotImplementedError(f"a packed {self.kind} starts from zeros: an initial state is not batched")
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise NotImplementedError(f"a packed {self.kind} takes a batched (3-D) tensor, not a PackedSequence or one sequence")
        return (self.num_layers, self.batch_first, self.dropout if self.training else 0.0)

    def _weights(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.names]


class VmappedGRU(_VmappedRecurrent):
    """An nn.GRU whose call batches across models under vmap; (output, h_n) as nn.GRU's."""

    kind = "nn.GRU"

    def forward(self, x: Any, hx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return _GRUCall.apply(x, self._settings(x, hx), *self._weights())


class VmappedLSTM(_VmappedRecurrent):
    """An nn.LSTM whose call batches across models under vmap; (output, (h_n, c_n)) as nn.LSTM's."""

    kind = "nn.LSTM"

    def forward(self, x: Any, hx: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        output, h_n, c_n = _LSTMCall.apply(x, self._settings(x, hx), *self._weights())
        return output, (h_n, c_n)


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





def stacked_lstm(x: torch.Tensor, settings: tuple[int, bool, float],
                 weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K models' LSTMs at once: x (K, B, T, I) if batch_first else (K, T, B, I); weights each with a leading K.
    Returns (output, h_n, c_n) with a leading K, as each model's nn.LSTM lays them out."""
    layers, batch_first, dropout = settings
    h = x.transpose(1, 2) if batch_first else x
    h_finals, c_finals = [], []
    for layer in range(layers):
        w_ih, w_hh, b_ih, b_hh = weights[4 * layer : 4 * layer + 4]
        if layer > 0 and dropout > 0:
            h = F.dropout(h, dropout, training=True)
        hidden = w_hh.shape[-1]
        # Gate rows from PyTorch's (i, f, g, o) to the layer's (o, i, f, g); both biases enter the gates additively.
        w_ih, w_hh, bias = (oifg(t, hidden) for t in (w_ih, w_hh, b_ih + b_hh))
        h, c = lstm_layer_and_cell(linear(h, w_ih, bias), w_hh)
        h_finals.append(h[:, -1])
        c_finals.append(c)
    output = h.transpose(1, 2) if batch_first else h
    return output, torch.stack(h_finals, dim=1), torch.stack(c_finals, dim=1)  # h_n, c_n: (K, layers, B, H)


def _call_of(stacked: Callable[..., tuple[torch.Tensor, ...]]) -> type[torch.autograd.Function]:
    """The autograd.Function of one model's layer stack (`stacked` on a pack of one), or (under vmap) all K models'
    in one recurrence: `stacked(x, settings, weights)` with a leading K on every tensor, outputs likewise."""

    class Call(torch.autograd.Function):
        @staticmethod
        def forward(x: torch.Tensor, settings: tuple[int, bool, float], *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(out[0] for out in stacked(x.unsqueeze(0), settings, tuple(w.unsqueeze(0) for w in weights)))

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.save_for_backward(inputs[0], *inputs[2:])
            ctx.settings = inputs[1]

        @staticmethod
        def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
            # Outside vmap (a blueprint called alone): recompute under autograd; packs take the vmap rule's graph.
            x, *weights = (t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors)
            with torch.enable_grad():
                outputs = Call.forward(x, ctx.settings, *weights)
                wanted = [t for t in (x, *weights) if t.requires_grad]
                grads = iter(torch.autograd.grad(outputs, wanted, grad_outputs, allow_unused=True))
            return (next(grads) if x.requires_grad else None, None, *(next(grads) if w.requires_grad else None for w in weights))

        @staticmethod
        def vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, settings: tuple[int, bool, float],
                 *weights: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
            k = info.batch_size

            def leading(t: torch.Tensor, dim: int | None) -> torch.Tensor:
                return t.unsqueeze(0).expand(k, *t.shape) if dim is None else t.movedim(dim, 0)

            outputs = stacked(leading(x, in_dims[0]), settings, tuple(leading(w, d) for w, d in zip(weights, in_dims[2:], strict=True)))
            return outputs, (0,) * len(outputs)

    Call.__name__ = Call.__qualname__ = f"_{stacked.__name__}_call"
    return Call


_GRUCall = _call_of(stacked_gru)
_LSTMCall = _call_of(stacked_lstm)
