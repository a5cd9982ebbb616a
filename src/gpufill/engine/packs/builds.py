"""`fit_many`'s models: `make_model()` called once per variant, seeded, as few at a time as the training needs.

A factory may hand back a module it handed back before (a cache per shape) or modules that share a submodule.
Trained in place, the later variant would start from the earlier one's trained weights and both results would
hold one object. So each model is built one variant ahead of the training: where a model shares a parameter or
buffer (the same storage) with one built before it and not yet trained, every variant from then on trains its own
deep copy and the factory's modules stay as it returned them. Sharing found only after the shared module trained
(a factory cycling through several cached modules) is refused in one line: its first weights are gone.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import detect, free_memory_bytes
from gpufill.engine.inputs import check_model
from gpufill.errors import InputError

PACK_COPIES = 8
"""A pack holds about this many copies of each model's weights: the model, its stacked row, the gradient, Adam's two
moments, the best weights kept, the weights at a stop, and the copy written back (activations come on top)."""
PACK_MEMORY_SHARE = 0.5
"""The share of the memory_margin of free memory one pack may plan on: the rest for its activations and data."""
PACK_MAX_BYTES = 2**30
"""...and never more than this: models whose pack would hold more are big enough to be compute-bound alone, so
smaller packs lose nothing. Measured (2-core EPYC, 100 x nn.Linear(1024, 1024), 2 epochs of 512 samples, pack=True):
4 packs of 25 took 26.9 s and peaked at 1.2 GB RSS, one pack of 100 28.8 s and 3.8 GB."""
_FIX = "make make_model build a new module on every call (no cached module or shared submodule), or return copy.deepcopy(cached)"


class Builds:
    """The variants' models in order, each built (seeded) at most one variant ahead of the training."""

    def __init__(self, make_model: Callable[[], nn.Module], seeds: Sequence[int]):
        self._make = make_model
        self._seeds = list(seeds)
        self._next = 0
        self._ahead: list[nn.Module] = []
        """Built, not yet handed out (untrained): the factory's modules as it returned them."""
        self._trained: list[tuple[int, list[weakref.ref[torch.Tensor]]]] = []
        """Each variant handed out to train in place, with weak references to its tensors (a freed model is forgotten)."""
        self.copies = False
        """Every variant trains a deep copy (the factory shares tensors between the modules it returns)."""

    def peek(self) -> nn.Module:
        """The next variant's model, built but not handed out (what a pack's memory is estimated from)."""
        self._fill(1)
        return self._ahead[0]

    def take(self, n: int) -> list[nn.Module]:
        """The next `n` variants' models, each its own tensors; one more is built first to see whether it shares any."""
        self._fill(n + 1)
        models, self._ahead = self._ahead[:n], self._ahead[n:]
        if self.copies:
            return [_copied(m) for m in models]
        first = self._next - len(self._ahead) - n
        self._trained.extend((first + i, [weakref.ref(t) for t in _tensors(m)]) for i, m in enumerate(models))
        return models

    def _fill(self, n: int) -> None:
        while len(self._ahead) < n and self._next < len(self._seeds):
            model = _seeded(self._make, self._seeds[self._next])
            self._check(model, self._next)
            self._ahead.append(model)
            self._next += 1

    def _check(self, model: nn.Module, index: int) -> None:
        held = _storages(_tensors(model))
        if any(held & _storages(_tensors(other)) for other in self._ahead):
            self.copies = True  # nothing trained yet that shares them: copies start from the factory's own weights
        for variant, refs in self._trained:
            if held & _storages([t for t in (r() for r in refs) if t is not None]):
                raise InputError(f"make_model returned for variant {index} a module sharing weights with variant {variant}'s, which "
                                 f"already trained them: variant {index} would start from variant {variant}'s trained weights",
                                 field="make_model", fix=_FIX)


def pack_chunk(model: nn.Module, cfg: FitConfig, k: int) -> tuple[int, str | None]:
    """How many of `k` variants of `model` one pack may hold in the memory free now; why fewer than all, or None."""
    per_model = PACK_COPIES * sum(t.numel() * t.element_size() for t in _tensors(model))
    free = free_memory_bytes(detect(cfg.device))
    share = PACK_MEMORY_SHARE * cfg.memory_margin * free
    budget = min(share, PACK_MAX_BYTES)
    fits = max(1, int(budget // max(per_model, 1)))
    if fits >= k:
        return k, None
    size = math.ceil(k / math.ceil(k / fits))  # even packs: 100 at 30 a pack is 4 packs of 25, not 30+30+30+10
    limit = (f"may plan on {_bytes(budget)} of the {_bytes(free)} free" if share <= PACK_MAX_BYTES else
             f"is capped at {_bytes(PACK_MAX_BYTES)}: models that large are compute-bound alone, so smaller packs lose nothing")
    return size, f"{k} variants in packs of at most {size}: a pack holds about {_bytes(per_model)} per model ({PACK_COPIES} copies of its weights) and {limit}"


def _bytes(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def _seeded(make_model: Callable[[], nn.Module], seed: int) -> nn.Module:
    seed_all(seed)
    model = make_model()
    if not isinstance(model, nn.Module):
        raise InputError(f"make_model returned a {type(model).__name__}, not a torch.nn.Module", field="make_model",
                         fix="pass a function of no arguments that builds the model, e.g. lambda: MyNet(width=64)")
    check_model(model, "make_model")
    return model


def seed_all(seed: int) -> None:
    """torch.manual_seed(seed). Where no accelerator is there to seed, its CPU generator directly: torch.manual_seed
    also queues a lazy seeding of CUDA, XPU and MPS, each capturing a stack trace (about 1 ms a call inside a
    training; 64 variants paid 70 ms), and the CPU's random stream is the same either way."""
    accelerators = torch.cuda.is_available() or torch.backends.mps.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if accelerators:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _copied(model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model)
    except Exception as error:  # noqa: BLE001 - a module holding something deepcopy cannot copy (a lock, a handle)
        raise InputError(f"make_model returns modules that share weights, and copying one failed ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''})", field="make_model", fix=_FIX) from None


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


def _storages(tensors: Sequence[torch.Tensor]) -> set[tuple[str, int]]:
    """Where the tensors' data lives: two tensors with one storage share their values (a view, a tied weight). Empty
    tensors hold no data to share (their address may be 0 in every module)."""
    return {(str(t.device), t.untyped_storage().data_ptr()) for t in tensors if t.untyped_storage().nbytes() > 0}
