"""A fused CPU Adam/AdamW step without torch's Python around its kernel, the same numbers bit for bit.

torch's fused step walks every parameter's state and regroups the tensors by device on each call. Once the state exists,
`Listing` lists each group's tensors (params, moments, step counts) and makes torch's same two calls on them: the step
counts' +1 (`torch._foreach_add_`), then the fused kernel (`torch._fused_adamw_`, or `torch._fused_adam_` for Adam's
coupled decay): 80-99 us a step against torch's 110-137 us for a linear layer, 101-150 against 133-198 us for the
MLP forecaster, whose whole step is ~1 ms (`bench/step_overhead.py`, one thread, three runs, 2026-11-30).

Every step first checks that the lists still stand for what torch's step would do: the same groups and parameters by
identity, each listed parameter's state and its tensors by identity, the group's kernel flags, plain-number lr and
betas, a gradient on every listed parameter and none on the others, no grad scaler's inputs. Anything else takes
torch's own step, after which the lists are built again; lists that fall back three steps in a row, or a group torch's
fused step does not run (not fused, amsgrad, capturable, differentiable, complex or mixed dtypes, not on a CPU), leave
the optimizer on torch's step for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

GIVE_UP_AFTER = 3
"""Fallbacks in a row after which the lists are not built again (a condition that lasts: a tensor lr, a grad scaler)."""


@dataclass(frozen=True, slots=True)
class _Group:
    """One parameter group as listed: its parameters, then the stepped ones' state tensors in torch's order."""

    params_list: list[torch.Tensor]
    """The group's own list, kept to notice it replaced."""
    members: tuple[torch.Tensor, ...]
    """Every parameter of the group, to notice one swapped."""
    params: list[torch.Tensor]
    """Those stepped: a gradient when listed (torch skips the others, and so must these lists)."""
    idle: tuple[torch.Tensor, ...]
    states: tuple[dict[str, Any], ...]
    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    steps: list[torch.Tensor]
    decoupled: bool

    def stands_for(self, group: dict[str, Any], state: Any) -> bool:
        params = group["params"]
        if params is not self.params_list or len(params) != len(self.members) or any(p is not q for p, q in zip(params, self.members, strict=True)):
            return False
        if not _listable(group) or _decoupled(group, self.decoupled) != self.decoupled:
            return False
        for param, kept, exp_avg, exp_avg_sq, step in zip(self.params, self.states, self.exp_avgs, self.exp_avg_sqs, self.steps, strict=True):
            if (state.get(param) is not kept or kept.get("exp_avg") is not exp_avg or kept.get("exp_avg_sq") is not exp_avg_sq
                    or kept.get("step") is not step):
                return False
        return all(p.grad is None for p in self.idle)


def _plain_number(value: Any) -> bool:
    return isinstance(value, float) or type(value) is int


def _listable(group: dict[str, Any]) -> bool:
    """Whether torch's fused step for this group is two calls on fixed lists: a plain fused step, plain-number lr and betas."""
    plain = group.get("fused") and not (group.get("amsgrad") or group.get("capturable") or group.get("differentiable"))
    return bool(plain) and _plain_number(group["lr"]) and all(_plain_number(beta) for beta in group["betas"])


def _decoupled(group: dict[str, Any], adamw: bool) -> bool:
    """AdamW's decay (or Adam's with decoupled_weight_decay): `_fused_adamw_`, else `_fused_adam_`."""
    return bool(group.get("decoupled_weight_decay", adamw))


class Listing:
    """The lists of one optimizer, built after torch's steps and used while they stand for its step."""

    def __init__(self) -> None:
        self.groups: tuple[_Group, ...] | None = None
        self.given_up = False
        self.fallbacks = 0

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Torch's fused step on the listed tensors; False (nothing done) where the lists no longer stand for it."""
        groups = self.groups
        if groups is None:
            return False
        if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
            return False
        param_groups, state = optimizer.param_groups, optimizer.state
        if len(param_groups) != len(groups):
            return False
        calls = []
        for group, listed in zip(param_groups, groups, strict=True):
            if not listed.stands_for(group, state):
                return False
            grads = [p.grad for p in listed.params]
            if any(grad is None or grad.is_sparse for grad in grads):
                return False
            calls.append((listed, grads, group))
        with torch.no_grad():
            for listed, grads, group in calls:
                if not listed.params:
                    continue
                torch._foreach_add_(listed.steps, 1)
                kernel = torch._fused_adamw_ if listed.decoupled else torch._fused_adam_
                beta1, beta2 = group["betas"]
                kernel(listed.params, grads, listed.exp_avgs, listed.exp_avg_sqs, [], listed.steps, amsgrad=False, lr=group["lr"], beta1=beta1,
                       beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"], grad_scale=None, found_inf=None)
        self.fallbacks = 0
        return True

    def after_torch_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Lists built again from what torch's step left (its state, the gradients it stepped), unless given up."""
        if self.given_up:
            return
        if self.groups is not None:
            self.fallbacks += 1
            if self.fallbacks >= GIVE_UP_AFTER:
                self.groups, self.given_up = None, True
                return
        groups, permanent = _build(optimizer)
        self.groups, self.given_up = groups, permanent


def _build(optimizer: torch.optim.Optimizer) -> tuple[tuple[_Group, ...] | None, bool]:
    """(the lists, False), or (None, True) where torch's step must run for good, or (None, False) to try again later."""
    if not hasattr(torch, "_fused_adamw_"):
        return None, True
    adamw = isinstance(optimizer, torch.optim.AdamW)
    groups = []
    for group in optimizer.param_groups:
        params = group["params"]
        if not _listable(group):
            return None, True
        if any(p.device.type != "cpu" or p.is_complex() or p.dtype != params[0].dtype for p in params):
            return None, True
        stepped = [p for p in params if p.grad is not None]
        states = [optimizer.state.get(p) for p in stepped]
        if any(s is None or "exp_avg" not in s for s in states) or any(p.grad.is_sparse for p in stepped):
            return None, False
        groups.append(_Group(params, tuple(params), stepped, tuple(p for p in params if p.grad is None), tuple(states),
                             [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states],
                             _decoupled(group, adamw)))
    return tuple(groups), False
