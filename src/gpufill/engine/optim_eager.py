"""torch's own optimizers for an eager training, without the second of start-up their first call costs.

`torch.optim.Optimizer` wraps `add_param_group` and `zero_grad` in `torch._disable_dynamo`, and every `step` in a
wrapper that imports `torch._dynamo`: so that a `torch.compile` tracing the training does not trace into them. The
first call imports torch._dynamo (with sympy and the FX passes): 1.07 s on a 2-core AMD EPYC, a sixth of a
6-second training script, paid before the first step whether anything is compiled or not.

An eager training compiles nothing, so nothing can trace into its optimizer: `eager_class(kind)` is a subclass of
`kind` whose decorated methods (add_param_group, zero_grad, step, and a checkpoint's state_dict and load_state_dict)
call the undecorated functions the decorators wrap (`__wrapped__`, which functools.wraps keeps), with gradients off
as torch's step wrapper sets them. Same class for isinstance, schedulers
and state dicts; same kernels (`fused`, `foreach`) and so the same numbers bit for bit (tests/engine/test_optim.py).
A plan that compiles uses torch's classes as they are.

Adam and AdamW with the fused kernel on a CPU also skip the Python around the kernel once their state exists
(`_FusedLists`): torch's step walks every parameter's state and regroups the tensors by device each call. Listed once,
the same two calls torch makes (the step counts' +1, then the fused kernel) run on the lists, the same numbers bit for
bit: 49 us a step against torch's 101 us for a linear layer, 81 against 125 us for the MLP forecaster
(`bench/step_overhead.py`, one thread, 2026-11-30), whose whole step is ~1 ms. Anything the lists cannot stand for (a
missing or sparse gradient, a tensor learning rate, amsgrad, a grad scaler's inputs, groups or state replaced) takes
torch's own step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch


def _undecorated(function: Any) -> Any:
    """What a torch decorator wraps (itself when this torch version does not decorate it)."""
    return getattr(function, "__wrapped__", function)


@cache
def eager_class(kind: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`kind` with add_param_group, zero_grad, step, state_dict and load_state_dict free of the lazy torch._dynamo import."""
    add_param_group = _undecorated(kind.add_param_group)
    zero_grad = _undecorated(kind.zero_grad)
    step = _undecorated(kind.step)
    state_dict = _undecorated(kind.state_dict)  # a checkpoint's save and resume
    load_state_dict = _undecorated(kind.load_state_dict)

    direct = issubclass(kind, torch.optim.Adam | torch.optim.AdamW)

    class Eager(kind):  # type: ignore[valid-type, misc]
        _lists: _FusedLists | None = None
        _listed = False
        """Whether the lists were tried since the state last changed: a refusal is not re-tried every step."""

        def add_param_group(self, param_group: dict[str, Any]) -> None:
            add_param_group(self, param_group)
            self._lists, self._listed = None, False

        def zero_grad(self, set_to_none: bool = True) -> None:
            zero_grad(self, set_to_none)

        def step(self, closure: Any = None) -> Any:
            if closure is None and self._lists is not None and self._lists.step(self):
                return None
            with torch.no_grad():  # torch's step wrapper: no autograd graph of the update (differentiable=False)
                result = step(self, closure)
            if direct and not self._listed:
                self._lists, self._listed = _FusedLists.build(self), True
            return result

        def state_dict(self) -> dict[str, Any]:
            return state_dict(self)

        def load_state_dict(self, state: dict[str, Any]) -> None:
            load_state_dict(self, state)
            self._lists, self._listed = None, False  # new state tensors: the lists are built again after the next step

    Eager.__name__ = Eager.__qualname__ = kind.__name__
    Eager.__module__ = __name__
    return Eager


@dataclass(frozen=True, slots=True)
class _Group:
    """One parameter group's tensors, in torch's order, and the kernel its class calls."""

    params_list: list[torch.Tensor]
    """The group's own list, kept to notice it replaced or grown."""
    params: list[torch.Tensor]
    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    steps: list[torch.Tensor]
    kernel: Any


@dataclass(frozen=True, slots=True)
class _FusedLists:
    """A fused CPU Adam/AdamW's tensors, listed once: its step is then torch's two calls on them."""

    groups: tuple[_Group, ...]

    @staticmethod
    def build(optimizer: torch.optim.Optimizer) -> _FusedLists | None:
        """The lists, or None where torch's own step must run (not fused, not on a CPU, amsgrad, complex, no state yet)."""
        decoupled_class = isinstance(optimizer, torch.optim.AdamW)
        groups = []
        for group in optimizer.param_groups:
            params = group["params"]
            if not (group.get("fused") and not group.get("amsgrad") and not group.get("capturable") and not group.get("differentiable")):
                return None
            if not params or any(p.device.type != "cpu" or p.is_complex() or p.dtype != params[0].dtype for p in params):
                return None
            states = [optimizer.state.get(p, {}) for p in params]
            if any("exp_avg" not in state for state in states):
                return None
            decoupled = decoupled_class or group.get("decoupled_weight_decay", False)
            groups.append(_Group(params, list(params), [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                                 [s["step"] for s in states], torch._fused_adamw_ if decoupled else torch._fused_adam_))
        return _FusedLists(tuple(groups))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Torch's fused step on the listed tensors; False (nothing done) where the lists no longer stand for it."""
        if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
            return False
        param_groups = optimizer.param_groups
        if len(param_groups) != len(self.groups):
            return False
        calls = []
        for group, listed in zip(param_groups, self.groups, strict=True):
            params, lr, betas = group["params"], group["lr"], group["betas"]
            if params is not listed.params_list or len(params) != len(listed.params):
                return False
            if type(lr) is not float or type(betas[0]) is not float or type(betas[1]) is not float:
                return False
            grads = [p.grad for p in listed.params]
            if any(grad is None or grad.is_sparse for grad in grads):
                return False
            if optimizer.state[listed.params[0]].get("exp_avg") is not listed.exp_avgs[0]:
                return False  # the state was replaced by hand
            calls.append((listed, grads, group))
        with torch.no_grad():
            for listed, grads, group in calls:
                torch._foreach_add_(listed.steps, 1)
                listed.kernel(listed.params, grads, listed.exp_avgs, listed.exp_avg_sqs, [], listed.steps, amsgrad=False,
                              lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
                              eps=group["eps"], maximize=group["maximize"], grad_scale=None, found_inf=None)
        return True
