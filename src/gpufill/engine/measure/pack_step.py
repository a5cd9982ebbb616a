"""How a pack's step runs, measured on the real pack before its first epoch: whether compiling
the fused forward pays, and whether replaying the whole step as a CUDA graph beats eager
steps. Each measurement puts every weight, optimizer moment, accumulator and random state
back, and is cached per shape, so the campaign measures a shape once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from gpufill.engine.choice import Choice
from gpufill.engine.measure.cache import TuneCache
from gpufill.engine.measure.compile import CompileMeasurement, cached_compile_choice, time_compile
from gpufill.engine.measure.state import preserved_rng
from gpufill.engine.measure.timing import MEASURE_SEED, seconds_per_step
from gpufill.engine.packs.graph import capture_step
from gpufill.engine.packs.optim import PackAdamW
from gpufill.engine.precision import Precision

GRAPH_MIN_GAIN = 1.05
"""Replaying the step as a graph is kept when at least this much faster than eager steps."""


class PackTraining(Protocol):
    """What the measurements need of a pack's training (packs/train.py's run)."""

    fused: nn.Module
    optimizer: PackAdamW
    precision: Precision
    data: Any
    """x (K, N, ...) and batch."""
    k: int
    device: torch.device
    compiled: bool
    events: list[list[str]]

    loss_sum: torch.Tensor
    finite: torch.Tensor
    graph: Any

    def load_batch(self, order: torch.Tensor, start: int) -> None: ...
    def step(self) -> None: ...
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

    with preserved(run):
        return time_compile(lambda args: _eager_step(run, args), _step_stream(run), run.device, use_compiled=use_compiled,
                            on_error=lambda _error: run.use_eager())


def _eager_step(run: PackTraining, batch: tuple[torch.Tensor, int]) -> None:
    run.load_batch(*batch)
    run.step()


def choose_step_graph(run: PackTraining, requested: bool | str, *, cache: TuneCache, key: str) -> Choice[bool]:
    """Capture the pack's step as a CUDA graph and keep it if asked to, or if its replays measure
    faster than eager steps (cached per shape). Off the GPU, or on any capture error: eager."""
    if requested is False:
        return Choice(False, "off: requested")
    if run.device.type != "cuda":
        return Choice(False, "off: CUDA graphs need a CUDA device")
    if run.compiled:
        return Choice(False, "off: the forward is compiled (torch.compile schedules its own graphs)")
    cached = None if requested is True else cache.get(key)
    note = ", cached measurement" if cached is not None else ""
    if cached is not None and cached["eager_step_s"] / cached["graph_step_s"] < GRAPH_MIN_GAIN:  # decided before: no capture needed
        return Choice(False, f"off: replaying the step measured {cached['eager_step_s'] / cached['graph_step_s']:.2f}x eager steps "
                             f"(below {GRAPH_MIN_GAIN:g}x{note})")
    graph, how = capture_step(run.step, lambda: preserved(run), run.optimizer.zero_grad, run.device)
    if graph is None:
        return Choice(False, how)
    if requested is True:
        run.graph = graph
        return Choice(True, f"requested: {how}")
    if cached is None:
        with preserved(run):
            eager = seconds_per_step(lambda batch: _eager_step(run, batch), _step_stream(run), run.device)
            replayed = seconds_per_step(lambda batch: (run.load_batch(*batch), graph.replay()), _step_stream(run), run.device)
        cached = {"eager_step_s": eager, "graph_step_s": replayed}
        cache.put(key, cached)
    gain = cached["eager_step_s"] / cached["graph_step_s"]
    if gain >= GRAPH_MIN_GAIN:
        run.graph = graph
        return Choice(True, f"{how}: {gain:.2f}x eager steps (measured{note})")
    return Choice(False, f"off: replaying the step measured {gain:.2f}x eager steps (below {GRAPH_MIN_GAIN:g}x{note})")


def _step_stream(run: PackTraining) -> Iterator[tuple[torch.Tensor, int]]:
    """(order, start) of real batches without end, from a measurement-only permutation."""
    data = run.data
    width = data.x.shape[1]
    generator = torch.Generator(device=run.device).manual_seed(MEASURE_SEED)
    order = torch.stack([torch.randperm(width, device=run.device, generator=generator) for _ in range(run.k)])
    while True:
        for start in range(0, width, data.batch):
            yield order, start


@contextlib.contextmanager
def preserved(run: PackTraining) -> Iterator[None]:
    """Put back everything trial steps change: weights, optimizer moments and steps, loss scale,
    the epoch's loss sums, RNGs."""
    optimizer = run.optimizer
    live = [*run.fused.state_dict().values(), optimizer.steps, optimizer.exp_avg, optimizer.exp_avg_sq, *run.precision.device_state(),
            run.loss_sum, run.finite]
    saved = [t.detach().clone() for t in live]
    try:
        with preserved_rng(run.device):
            yield
    finally:
        with torch.no_grad():
            for tensor, copy in zip(live, saved, strict=True):
                tensor.copy_(copy)
        optimizer.zero_grad()


