"""Fused packs: K same-shape models trained as one set of kernels.

A fused module keeps the plain model's parameter *names* and adds a leading model
dimension K to every parameter (plain `head.weight` (H, D) -> fused `head.weight`
(K, H, D)). So fusing is stacking the K models' state dicts, `unfuse(k)` is slicing
them, and fused model k starts from exactly the weights of plain model k.

Inputs are (K, batch, lookback, features): each model sees its own data. Model k's
output depends only on model k's parameters and inputs, so its loss and gradients are
those of the plain model trained alone.

This module is the mechanism: the base class, the registry (`fuses`) and `fuse`. Kernels
for particular model classes register themselves with `fuses` when their module is
imported (the forecasters' by `gpufill.forecasting.models.builtin`, with the families).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import nn

from gpufill.errors import InputError

_FUSED: dict[type[nn.Module], type[FusedModule]] = {}
F = TypeVar("F", bound="type[FusedModule]")


def fuses(plain_cls: type[nn.Module]) -> Callable[[F], F]:
    """Class decorator: this fused class implements packs of `plain_cls`."""

    def register(fused_cls: F) -> F:
        _FUSED[plain_cls] = fused_cls
        return fused_cls

    return register


class FusedModule(nn.Module):
    """K copies of `template`'s architecture with stacked parameters of the same names."""

    def __init__(self, template: nn.Module, k: int):
        super().__init__()
        self.k = k
        # Kept outside the module tree (a tuple): a blueprint for unfuse, not a parameter holder.
        self._template = (copy.deepcopy(template).cpu(),)

    @property
    def template(self) -> nn.Module:
        return self._template[0]

    @classmethod
    def from_models(cls, models: Sequence[nn.Module]) -> FusedModule:
        fused = cls(models[0], len(models))
        states = [m.state_dict() for m in models]
        stacked = {name: torch.stack([s[name] for s in states]) for name in states[0]}
        fused.load_state_dict(stacked)
        return fused.to(next(models[0].parameters()).device)

    def unfuse(self, k: int) -> nn.Module:
        """A plain model holding model k's current weights."""
        plain = copy.deepcopy(self.template)
        plain.load_state_dict({name: tensor[k].detach().clone() for name, tensor in self.state_dict().items()})
        return plain.to(next(self.parameters()).device)

    def stacked(self, *shape: int) -> nn.Parameter:
        """A (K, *shape) parameter; its values come from from_models' stacked state dict."""
        return nn.Parameter(torch.empty(self.k, *shape))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Per-model linear layer: x (K, ..., in), weight (K, out, in), bias (K, out) -> (K, ..., out)."""
    k = x.shape[0]
    flat = x.reshape(k, -1, x.shape[-1])
    if bias is None:
        out = torch.bmm(flat, weight.transpose(1, 2))
    else:
        out = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
    return out.reshape(*x.shape[:-1], weight.shape[1])


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-model LayerNorm over the last dim: x (K, ..., D), weight/bias (K, D)."""
    normed = nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
    view = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return normed * weight.view(view) + bias.view(view)


def fuse(models: Sequence[nn.Module]) -> FusedModule:
    """One fused module from K plain models of the same class and shape."""
    if not models:
        raise InputError("no models to fuse", field="pack", fix="pass at least one model")
    plain_cls = type(models[0])
    if plain_cls not in _FUSED:
        raise InputError(f"{plain_cls.__name__} has no fused kernel", field="pack", fix="train it unfused (fusion off)")
    shapes = {tuple((n, tuple(p.shape)) for n, p in m.state_dict().items()) for m in models}
    if len({type(m) for m in models}) != 1 or len(shapes) != 1:
        raise InputError("models in a pack must share class and shapes", field="pack", fix="group trials by shape before fusing")
    return _FUSED[plain_cls].from_models(models)


def can_fuse(model: nn.Module) -> bool:
    return type(model) in _FUSED
