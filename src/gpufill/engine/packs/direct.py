"""A stacked forward without vmap, for models made of layers that batch over a leading K by themselves.

vmap re-dispatches every operator of every call through its batching rules; a pack of small models pays that on
each step (on one CPU core, a K=16 MLP's forward and backward: 4.1 ms under vmap, 2.8 ms as direct batched
matrix products). A model whose traced graph (torch.fx) holds only `nn.Linear` layers (one `baddbmm` over the
stacked weights) and elementwise activations between them (which act on (K, ...) tensors as on one model's) runs
here directly; anything else — a parameter read in `forward`, a reshape, a reduction, a second input, code fx
cannot trace — returns None and the pack keeps vmap. The result is the vmap forward's to float rounding
(`why_not_stacked` checks the pack it will train, this path included).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATION_MODULES = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Mish, nn.Identity)
ACTIVATION_FUNCTIONS = {torch.relu, F.relu, F.gelu, torch.tanh, F.tanh, torch.sigmoid, F.sigmoid, F.silu, F.leaky_relu, F.elu, F.softplus}
ACTIVATION_METHODS = {"relu", "tanh", "sigmoid"}
ELEMENTWISE_BINARY = {operator.add, operator.sub, operator.mul, torch.add, torch.mul}

Forward = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]
"""(stacked state: name -> (K, ...) tensor, input (K, b, ...)) -> output (K, b, ...)."""


_TRACED: dict[tuple[Any, ...], Forward | None] = {}
"""direct_forward's answer per model class and layers (tracing costs ~10 ms; a pack is built more than once)."""


def direct_forward(model: nn.Module) -> Forward | None:
    """The model's forward over stacked weights without vmap, or None where it is not a chain of recognised layers."""
    key = (type(model), tuple((name, repr(m)) for name, m in model.named_modules() if not m._modules))
    if key not in _TRACED:
        _TRACED[key] = _trace(model)
    return _TRACED[key]


def _trace(model: nn.Module) -> Forward | None:
    try:
        import torch.fx

        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - control flow on values, unsupported Python: vmap's case
        return None
    modules = dict(model.named_modules())
    steps: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []
    inputs = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            inputs += 1
            if inputs > 1:
                return None
        elif node.op == "call_module":
            module = modules[node.target]
            if type(module) is nn.Linear:
                steps.append(("linear", node, (node.args[0],), {"prefix": node.target}))
            elif isinstance(module, ACTIVATION_MODULES):
                steps.append(("module", node, tuple(node.args), {"module": module}))
            else:
                return None
        elif node.op == "call_function" and (node.target in ACTIVATION_FUNCTIONS or node.target in ELEMENTWISE_BINARY):
            steps.append(("function", node, tuple(node.args), dict(node.kwargs)))
        elif node.op == "call_method" and node.target in ACTIVATION_METHODS:
            steps.append(("method", node, tuple(node.args), dict(node.kwargs)))
        elif node.op == "output":
            if not isinstance(node.args[0], torch.fx.Node):
                return None
            result = node.args[0]
        else:
            return None
    if inputs != 1 or not any(kind == "linear" for kind, *_ in steps):
        return None
    placeholder = next(node for node in graph.nodes if node.op == "placeholder")
    return _Chain(placeholder, steps, result)


class _Chain:
    """The traced steps, run on stacked tensors: `nn.Linear` as one baddbmm (bmm without a bias), the rest as is."""

    def __init__(self, placeholder: Any, steps: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]], result: Any):
        self.placeholder, self.steps, self.result = placeholder, steps, result

    def __call__(self, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        values: dict[Any, Any] = {self.placeholder: x}

        def value(arg: Any) -> Any:
            return values[arg] if arg in values else arg

        for kind, node, args, extra in self.steps:
            given = [value(a) for a in args]
            if kind == "linear":
                values[node] = _linear(given[0], state[f"{extra['prefix']}.weight"], state.get(f"{extra['prefix']}.bias"))
            elif kind == "module":
                values[node] = extra["module"](*given)
            elif kind == "function":
                values[node] = node.target(*given, **{k: value(v) for k, v in extra.items()})
            else:
                values[node] = getattr(given[0], node.target)(*given[1:], **extra)
        return values[self.result]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (K, b, ..., in) through K stacked Linears: weight (K, out, in), bias (K, out)."""
    k, features = x.shape[0], x.shape[-1]
    flat = x.reshape(k, -1, features)
    out = torch.bmm(flat, weight.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
    return out.view(*x.shape[:-1], weight.shape[1])
