"""A stacked forward without vmap, for models made of layers that batch over a leading K by themselves.

vmap re-dispatches every operator of every call through its batching rules; a pack of small models pays that on
each step (on one CPU core, a K=16 MLP's forward and backward: 4.1 ms under vmap, 2.8 ms as direct batched
matrix products). A model whose traced graph (torch.fx) holds only recognised layers runs here directly:
- `nn.Linear`: one `baddbmm` over the stacked weights, on values laid out (K, b, ...);
- `nn.Conv1d`/`nn.Conv2d` (zero padding, groups 1): one convolution with groups=K over values laid out
  (b, K*C, ...), the K models' channels side by side and each model's bias inside the kernel. vmap's rule runs
  the same grouped convolution but adds the bias apart and moves K in and out around every layer it has no rule
  in place for (a small CNN's pack spent a third of its step in those copies and adds);
- pooling (`MaxPool`, `AvgPool`) per channel on that layout, `nn.Flatten` back to (K, b, features);
- elementwise activations between them (on either layout, as on one model's tensor), and elementwise sums of two
  values of one layout (a residual).
Anything else — a parameter read in `forward`, a reshape, a reduction, a second input, code fx cannot trace —
returns None and the pack keeps vmap. The result is the vmap forward's to float rounding (`why_not_stacked`
checks the pack it will train, this path included).
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
CONVOLUTIONS = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d}
POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
STACKED, GROUPED = "stacked", "grouped"
"""A value's layout: (K, b, ...) each model's rows apart, or (b, K*C, ...) the models' channels side by side."""

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
    layout: dict[Any, str] = {}
    """Each traced value's layout (STACKED or GROUPED); the input is STACKED."""
    inputs = 0
    produced_by_layer: set[Any] = set()
    """Values a Linear or convolution produced: their backward does not read them, so a ReLU may overwrite them."""
    for node in graph.nodes:
        sources = [a for a in node.args if isinstance(a, torch.fx.Node)]
        given = layout[sources[0]] if sources else STACKED
        if node.op == "placeholder":
            inputs += 1
            if inputs > 1:
                return None
            layout[node] = STACKED
        elif node.op == "call_module":
            module = modules[node.target]
            if type(module) is nn.Linear:
                steps.append(("linear", node, (node.args[0],), {"prefix": node.target, "layout": given}))
                layout[node] = STACKED
                produced_by_layer.add(node)
            elif type(module) in CONVOLUTIONS and module.groups == 1 and module.padding_mode == "zeros":
                steps.append(("conv", node, (node.args[0],), {"prefix": node.target, "module": module, "layout": given}))
                layout[node] = GROUPED
                produced_by_layer.add(node)
            elif type(module) is nn.ReLU and _overwritable(node, produced_by_layer):
                steps.append(("relu_", node, (node.args[0],), {}))
                layout[node] = given
            elif isinstance(module, POOLS) and not getattr(module, "return_indices", False):
                steps.append(("pool", node, (node.args[0],), {"module": module, "layout": given}))
                layout[node] = GROUPED
            elif type(module) is nn.Flatten and module.start_dim == 1 and module.end_dim == -1:
                steps.append(("flatten", node, (node.args[0],), {"layout": given}))
                layout[node] = STACKED
            elif isinstance(module, ACTIVATION_MODULES):
                steps.append(("module", node, tuple(node.args), {"module": module}))
                layout[node] = given
            else:
                return None
        elif node.op in ("call_function", "call_method") and node.target in (torch.relu, F.relu, "relu") and _overwritable(node, produced_by_layer):
            steps.append(("relu_", node, (node.args[0],), {}))
            layout[node] = given
        elif node.op == "call_function" and (node.target in ACTIVATION_FUNCTIONS or node.target in ELEMENTWISE_BINARY):
            if len({layout[a] for a in sources}) > 1:
                return None  # a sum of values of two layouts: vmap's case
            steps.append(("function", node, tuple(node.args), dict(node.kwargs)))
            layout[node] = given
        elif node.op == "call_method" and node.target in ACTIVATION_METHODS:
            steps.append(("method", node, tuple(node.args), dict(node.kwargs)))
            layout[node] = given
        elif node.op == "output":
            if not isinstance(node.args[0], torch.fx.Node):
                return None
            result = node.args[0]
        else:
            return None
    if inputs != 1 or not any(kind in ("linear", "conv") for kind, *_ in steps):
        return None
    placeholder = next(node for node in graph.nodes if node.op == "placeholder")
    return _Chain(placeholder, steps, result, layout[result])


def _overwritable(node: Any, produced_by_layer: set[Any]) -> bool:
    """A ReLU of a layer's output that nothing else reads: in place saves writing a new (K, b, ...) tensor per layer."""
    source = node.args[0] if node.args else None
    return len(node.args) == 1 and not node.kwargs and source in produced_by_layer and len(source.users) == 1


class _Chain:
    """The traced steps, run on stacked tensors: `nn.Linear` as one baddbmm (bmm without a bias), a convolution as
    one grouped convolution, the rest as is; each value moved between layouts only where its next layer needs it."""

    def __init__(self, placeholder: Any, steps: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]], result: Any, result_layout: str):
        self.placeholder, self.steps, self.result, self.result_layout = placeholder, steps, result, result_layout
        self.convolves = any(kind == "conv" for kind, *_ in steps)

    def __call__(self, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        values: dict[Any, Any] = {self.placeholder: x}
        k = x.shape[0]

        def value(arg: Any) -> Any:
            return values[arg] if arg in values else arg

        for kind, node, args, extra in self.steps:
            given = [value(a) for a in args]
            if kind == "linear":
                values[node] = _linear(_stacked(given[0], k) if extra["layout"] == GROUPED else given[0],
                                       state[f"{extra['prefix']}.weight"], state.get(f"{extra['prefix']}.bias"))
            elif kind == "conv":
                values[node] = _conv(_grouped(given[0]) if extra["layout"] == STACKED else given[0], extra["module"],
                                     state[f"{extra['prefix']}.weight"], state.get(f"{extra['prefix']}.bias"))
            elif kind == "pool":
                values[node] = extra["module"](_grouped(given[0]) if extra["layout"] == STACKED else given[0])
            elif kind == "flatten":
                values[node] = _stacked(given[0], k).flatten(2) if extra["layout"] == GROUPED else given[0].flatten(2)
            elif kind == "relu_":  # a view (a Linear over more than one batch axis) is left alone: autograd would rebase it
                values[node] = given[0].relu_() if given[0]._base is None else torch.relu(given[0])
            elif kind == "module":
                values[node] = extra["module"](*given)
            elif kind == "function":
                values[node] = node.target(*given, **{key: value(v) for key, v in extra.items()})
            else:
                values[node] = getattr(given[0], node.target)(*given[1:], **extra)
        out = values[self.result]
        return _stacked(out, k) if self.result_layout == GROUPED else out


def _grouped(x: torch.Tensor) -> torch.Tensor:
    """(K, b, C, ...) -> (b, K*C, ...): one copy, the models' channels side by side."""
    return x.transpose(0, 1).flatten(1, 2)


def _stacked(x: torch.Tensor, k: int) -> torch.Tensor:
    """(b, K*C, ...) -> (K, b, C, ...), a view."""
    return x.unflatten(1, (k, -1)).transpose(0, 1)


def _conv(x: torch.Tensor, module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (b, K*C, ...) through K stacked convolutions: weight (K, O, C, ...), bias (K, O) -> (b, K*O, ...)."""
    k = weight.shape[0]
    return CONVOLUTIONS[type(module)](x, weight.flatten(0, 1), None if bias is None else bias.flatten(), module.stride, module.padding,
                                      module.dilation, groups=k)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (K, b, ..., in) through K stacked Linears: weight (K, out, in), bias (K, out)."""
    k, features = x.shape[0], x.shape[-1]
    flat = x.reshape(k, -1, features)
    out = torch.bmm(flat, weight.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
    return out if x.dim() == 3 else out.view(*x.shape[:-1], weight.shape[1])
