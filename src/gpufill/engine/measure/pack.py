"""A pack's measured choices: how many models to fuse (per shape and device), and whether
compiling the fused forward pays.

Both time real training steps. The pack size is measured on a sample batch before any
pack exists (`campaign/packs.py` asks); the compile measurement runs on the real pack
before its first epoch and puts every weight, optimizer moment and random state back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from gpufill.engine.backend import synchronize
from gpufill.engine.choice import Choice
from gpufill.engine.measure.cache import TuneCache
from gpufill.engine.measure.compile import CompileMeasurement, cached_compile_choice, time_compile
from gpufill.engine.measure.ops import count_ops
from gpufill.engine.measure.state import preserved_rng
from gpufill.engine.measure.timing import MEASURE_SEED
from gpufill.engine.packs.fused import fuse
from gpufill.engine.packs.optim import PackAdamW
from gpufill.engine.precision import Precision

Pair = tuple[torch.Tensor, torch.Tensor]


class PackTraining(Protocol):
    """What the compile measurement needs of a pack's training (packs/train.py's run)."""

    fused: nn.Module
    optimizer: PackAdamW
    precision: Precision
    data: Any
    """x (K, N, ...) and batch."""
    k: int
    device: torch.device
    compiled: bool
    events: list[list[str]]

    def step(self, index: torch.Tensor, start: int) -> Any: ...
    def use_compiled(self) -> None: ...
    def use_eager(self) -> None: ...


def choose_pack_compile(run: PackTraining, planned: Choice[bool], *, requested: bool, cache: TuneCache, key: str) -> Choice[bool]:
    """Compile the pack's fused forward if asked to (the plan's choice stands), or if measured
    faster than eager (cached per shape)."""
    if requested:
        run.use_compiled()
        return planned
    choice = cached_compile_choice(cache, key, lambda: _measure_compile(run))
    if choice is None:
        return Choice(False, "off: compile failed while measuring; the pack runs eager")
    if choice.value and not run.compiled:
        run.use_compiled()
    elif not choice.value:
        run.use_eager()
    for events in run.events:
        events.append(f"compile: {choice.reason}")
    return choice


def _measure_compile(run: PackTraining) -> CompileMeasurement | None:
    def use_compiled() -> bool:
        run.use_compiled()
        return True

    with _preserved(run):
        return time_compile(lambda args: run.step(*args), _step_stream(run), run.device, use_compiled=use_compiled,
                            on_error=lambda _error: run.use_eager())


def _step_stream(run: PackTraining) -> Iterator[tuple[torch.Tensor, int]]:
    """(index, start) of real batches without end, from a measurement-only permutation."""
    data = run.data
    width = data.x.shape[1]
    generator = torch.Generator(device=run.device).manual_seed(MEASURE_SEED)
    order = torch.stack([torch.randperm(width, device=run.device, generator=generator) for _ in range(run.k)])
    while True:
        for start in range(0, width, data.batch):
            yield order[:, start : start + data.batch], start


@contextlib.contextmanager
def _preserved(run: PackTraining) -> Iterator[None]:
    """Put back everything trial steps change: weights, optimizer moments and steps, loss scale, RNGs."""
    optimizer = run.optimizer
    live = [*run.fused.state_dict().values(), optimizer.steps, optimizer.exp_avg, optimizer.exp_avg_sq, *run.precision.device_state()]
    saved = [t.detach().clone() for t in live]
    try:
        with preserved_rng(run.device):
            yield
    finally:
        with torch.no_grad():
            for tensor, copy in zip(live, saved, strict=True):
                tensor.copy_(copy)
        optimizer.zero_grad()


@dataclass(frozen=True, slots=True)
class PackSizeChoice:
    """How many models to fuse for one shape on this device, measured, with the reason."""

    size: int
    samples_per_s: dict[int, float]
    reason: str
    ops_per_step: dict[int, int] = field(default_factory=dict)
    """Computing operators (about one kernel launch each) of one training step per K, when counted."""


def measure_pack_size(build, sample: Pair, *, batch: int, device: str, candidates: Sequence[int] = (1, 2, 4, 8), steps: int = 4,
                      count: bool = False) -> PackSizeChoice:
    """Time a few training steps unfused (size 1) and fused at each candidate K; keep the fastest.
    With `count`, also count each step's operators (a benchmark's figure; one extra step each).

    `build()` returns a fresh plain model. Fusion is used only where it measured faster
    than the plain path on this device (on a small CPU, plain cuDNN-free kernels can win).
    """
    dev = torch.device(device)
    x, y = sample[0][:batch].to(dev), sample[1][:batch].to(dev)
    rates: dict[int, float] = {}
    ops: dict[int, int] = {}
    for k in candidates:
        models = [build() for _ in range(k)]
        if k == 1:
            model = models[0].to(dev)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step() -> None:
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        else:
            fused = fuse(models).to(dev)
            pack_optimizer = PackAdamW(list(fused.parameters()), torch.full((k,), 1e-3, device=dev), torch.zeros(k, device=dev))
            xs, ys = x.expand(k, *x.shape).contiguous(), y.expand(k, *y.shape).contiguous()
            everyone = torch.ones(k, dtype=torch.bool, device=dev)

            def step() -> None:
                (fused(xs) - ys).pow(2).mean(dim=(1, 2)).sum().backward()
                pack_optimizer.step(everyone)
                pack_optimizer.zero_grad()

        step()  # warm-up: allocator, kernel selection
        if count:
            ops[k] = count_ops(step).total
        synchronize(dev)
        tick = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(dev)
        rates[k] = k * x.shape[0] * steps / (time.perf_counter() - tick)
    best = max(rates, key=rates.__getitem__)
    gain = rates[best] / rates[1]
    reason = (
        f"fused packs of {best}: {gain:.2f}x the samples/s of one model at a time (measured on {dev.type})"
        if best > 1
        else f"unfused: no fused pack size beat one model at a time on {dev.type} (best {max(r for kk, r in rates.items() if kk > 1) / rates[1]:.2f}x)"
    )
    return PackSizeChoice(size=best, samples_per_s=rates, reason=reason, ops_per_step=ops)
