"""Any elementwise optimizer over K stacked models: the one each variant's `fit` would build, stepped as one.

`fit_many` builds each variant's optimizer exactly as `fit` would (`make_optimizer`: a named optimizer with the
variant's lr and weight decay, or the user's factory) and reads its recipe: the class, the constructor's settings
and the parameter groups as parameter positions with their hyperparameters. An optimizer whose update is
elementwise per parameter (Adam, AdamW, SGD with momentum or Nesterov, RMSprop, Adagrad, ...) steps K models as
one when it runs over the rows of the stacked (K, ...) tensors: `StackedOptimizer` hands torch's own class leaf
views of consecutive rows whose models share every hyperparameter and step count (a run), so each model is
stepped by the very arithmetic that steps it alone. A model that stops leaves its run, which splits; the state of
the others moves with them (row slices of their tensors).

Whether an optimizer is elementwise is not assumed: `why_not_stacked_optimizer` steps two stacked models and the
same two alone for a few steps and compares them to float rounding (a per-tensor norm, as LAMB's, or a closure, as
LBFGS's, is caught there and trains one at a time, with the reason).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CHECK_STEPS = 3
"""Steps of the elementwise check: enough for momentum, second moments and step-dependent scalars to show."""
CHECK_RTOL, CHECK_ATOL = 1e-5, 1e-6
"""Float rounding, not a different update: a fused CPU kernel rounds its vector body and its scalar tail apart, and
a stacked tensor splits there elsewhere than one model's (last-bit differences); a per-tensor norm moves a model by
about its learning rate."""


@dataclass(frozen=True)
class OptimizerRecipe:
    """One model's optimizer, as positions of its parameters: what a pack must reproduce."""

    kind: type[torch.optim.Optimizer]
    settings: dict[str, Any]
    """The constructor's keyword arguments found in the optimizer's defaults."""
    groups: tuple[tuple[tuple[int, ...], dict[str, Any]], ...]
    """Each param group: the positions of its parameters (in the model's parameter order) and its hyperparameters."""

    def same_as(self, other: OptimizerRecipe) -> bool:
        """Every setting and hyperparameter equal: the two models can be stepped by one call."""
        return (self.kind is other.kind and _equal(self.settings, other.settings) and len(self.groups) == len(other.groups)
                and all(a[0] == b[0] and _equal(a[1], b[1]) for a, b in zip(self.groups, other.groups, strict=True)))


def recipe_of(optimizer: torch.optim.Optimizer, model: nn.Module) -> OptimizerRecipe:
    """The recipe of `optimizer`, built on `model`'s parameters."""
    position = {id(p): j for j, (_name, p) in enumerate(model.named_parameters())}
    groups = []
    for group in optimizer.param_groups:
        indices = tuple(position[id(p)] for p in group["params"])
        groups.append((indices, {key: value for key, value in group.items() if key != "params"}))
    accepted = _constructor_arguments(type(optimizer))
    settings = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    return OptimizerRecipe(type(optimizer), settings, tuple(groups))


@functools.cache
def _constructor_arguments(kind: type[torch.optim.Optimizer]) -> frozenset[str]:
    return frozenset(inspect.signature(kind.__init__).parameters)


class StackedOptimizer:
    """Torch's own optimizer over K stacked models, one run of consecutive models at a time.

    `params`: the stacked (K, ...) leaves in the models' parameter order; `recipes`: each model's optimizer (one
    class; its groups and hyperparameters may differ from model to model: each run follows its own). `step(models)` steps the models at `models` (ascending) by their rows' gradients; a parameter without
    a gradient is skipped, as torch skips it alone. `lr` is each model's learning rate now (its first group's)."""

    def __init__(self, params: Sequence[nn.Parameter], recipes: Sequence[OptimizerRecipe]):
        self.params = list(params)
        self.recipes = list(recipes)
        self.k = len(self.recipes)
        self.factor = 1.0
        self.active: list[int] = list(range(self.k))
        self.runs: list[tuple[int, int]] = []
        self.views: dict[tuple[int, int, int], nn.Parameter] = {}
        """(start, stop, parameter position) -> the leaf over those rows that the optimizer steps."""
        self.optimizer: torch.optim.Optimizer | None = None
        self._build(self.active)

    @property
    def lr(self) -> list[float]:
        return [float(self.recipes[i].groups[0][1]["lr"]) * self.factor for i in range(self.k)]

    def set_lr_factor(self, factor: float) -> None:
        """Every group's lr = its model's lr x `factor` (a schedule's multiplier for the next step)."""
        self.factor = factor
        assert self.optimizer is not None
        for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
            group["lr"] = base * factor

    @torch.no_grad()
    def step(self, models: Sequence[int]) -> None:
        models = list(models)
        if not models:
            return
        if models != self.active:
            self._build(models)
        for (start, stop, j), view in self.views.items():
            grad = self.params[j].grad
            view.grad = None if grad is None else grad[start:stop]
        assert self.optimizer is not None
        self.optimizer.step()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for view in self.views.values():
            view.grad = None

    def _build(self, models: list[int]) -> None:
        """The optimizer over the runs of `models`; the state of an earlier build moves with its rows."""
        old_views, old_state = self.views, (self.optimizer.state if self.optimizer is not None else {})
        runs: list[tuple[int, int]] = []
        for i in models:
            if runs and runs[-1][1] == i and self.recipes[runs[-1][0]].same_as(self.recipes[i]):
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        views: dict[tuple[int, int, int], nn.Parameter] = {}
        groups, base_lrs = [], []
        for start, stop in runs:
            for positions, hyper in self.recipes[start].groups:
                members = []
                for j in positions:
                    view = nn.Parameter(self.params[j].detach()[start:stop], requires_grad=True)  # shares the stacked storage
                    views[(start, stop, j)] = view
                    members.append(view)
                groups.append({**hyper, "params": members})
                base_lrs.append(hyper["lr"])
        recipe = self.recipes[models[0]]
        optimizer = recipe.kind(groups, **recipe.settings)
        for (start, stop, j), view in views.items():
            source = next(((a, b, old) for (a, b, jj), old in old_views.items() if jj == j and a <= start and stop <= b), None)
            if source is not None and source[2] in old_state:
                optimizer.state[view] = _rows(old_state[source[2]], start - source[0], stop - source[0], source[2].shape)
        self.active, self.runs, self.views, self.optimizer, self._base_lrs = models, runs, views, optimizer, base_lrs
        self.set_lr_factor(self.factor)


def _rows(state: dict[str, Any], start: int, stop: int, shape: torch.Size) -> dict[str, Any]:
    """A run's share of a parameter's optimizer state: rows of the per-element tensors, copies of the rest (step
    counters are updated in place: two runs must not share one)."""
    out = {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.shape == shape:
            out[key] = value[start:stop]
        elif torch.is_tensor(value):
            out[key] = value.clone()
        else:
            out[key] = copy.deepcopy(value)
    return out


def why_not_stacked_optimizer(models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                              recipes: Sequence[OptimizerRecipe] | None = None, *, elementwise_known: bool = False) -> str | None:
    """None when the models' optimizers step correctly as one StackedOptimizer; else why not, in a few words.

    One class for every model, then (unless `elementwise_known`: the pack steps them by a kernel whose equivalence
    tests pin) a check on copies of the first two models: CHECK_STEPS steps of random gradients, stacked and alone,
    must end alike to float rounding (CHECK_RTOL)."""
    recipes = recipes or [recipe_of(o, m) for o, m in zip(optimizers, models, strict=True)]
    first = recipes[0]
    if any(recipe.kind is not first.kind for recipe in recipes):  # groups and hyperparameters may differ: each run has its own
        return "the variants' optimizers are of different classes"
    if elementwise_known:
        return None
    second = min(1, len(models) - 1)
    pairs = [copy.deepcopy([models[i], optimizers[i]]) for i in (0, second)]  # each copy's optimizer steps its copy's parameters
    pair, alone = [model for model, _ in pairs], [optimizer for _, optimizer in pairs]
    try:
        stacked = [nn.Parameter(torch.stack([a.detach(), b.detach()])) for a, b in zip(pair[0].parameters(), pair[1].parameters(), strict=True)]
        together = StackedOptimizer(stacked, [recipes[0], recipes[second]])
        generator = torch.Generator().manual_seed(0)
        for _ in range(CHECK_STEPS):
            for p in stacked:
                p.grad = torch.randn(p.shape, generator=generator).to(p.device, p.dtype)
            for i, model in enumerate(pair):
                for p, q in zip(model.parameters(), stacked, strict=True):
                    p.grad = q.grad[i].clone()
                alone[i].step()
            together.step([0, 1])
    except Exception as error:  # noqa: BLE001 - an optimizer that cannot step this way is a reason, not a crash
        text = str(error).strip().splitlines()
        return f"{first.kind.__name__} cannot step stacked models ({type(error).__name__}: {text[0][:120] if text else ''})"
    for i, model in enumerate(pair):
        for (name, p), q in zip(model.named_parameters(), stacked, strict=True):
            if not torch.allclose(p.detach(), q.detach()[i], rtol=CHECK_RTOL, atol=CHECK_ATOL):
                return f"{first.kind.__name__}'s update is not elementwise (stacked, {name} of a model moved apart from its own alone)"
    return None


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if torch.is_tensor(x) or torch.is_tensor(y):
            if not (torch.is_tensor(x) and torch.is_tensor(y) and x.shape == y.shape and torch.equal(x.cpu(), y.cpu())):
                return False
        elif x != y:
            return False
    return True
