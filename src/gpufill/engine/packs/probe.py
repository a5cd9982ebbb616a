"""How a pack's step runs, measured on the real pack before its first epoch: precision, CPU threads,
TF32 and cudnn.benchmark, compiling the fused forward, and replaying the whole step as a CUDA graph.

The same resolver as single trainings (`engine/measure/resolver.py`) decides; this probe measures a plan variant
on the pack itself and puts every weight, optimizer moment, loss scale, accumulator and random
state back; `configure` applies the finished plan to the pack once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from gpufill.engine.backend import backend_flags, synchronize
from gpufill.engine.choice import Choice
from gpufill.engine.graph import capture_step
from gpufill.engine.measure.deadline import deadline
from gpufill.engine.measure.resolver import CHECK_STEPS, Measurement
from gpufill.engine.measure.timing import MEASURE_SEED
from gpufill.engine.packs.optim import PackAdamW, PackSGD
from gpufill.engine.plan import Plan
from gpufill.engine.precision import Precision
from gpufill.engine.snapshot import preserved_rng


class PackTraining(Protocol):
    """What the measurements need of a pack's training (packs/pack_run.py's PackRun)."""

    fused: nn.Module
    optimizer: PackAdamW | PackSGD
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
    schedule: Any
    """Its lr schedule (packs/pack_schedule.py), whose step counts a step advances; None: a constant lr."""

    def load_batch(self, order: torch.Tensor, start: int) -> None: ...
    def step(self) -> None: ...
    def use_compiled(self, mode: Any = "default") -> None: ...
    def use_eager(self) -> None: ...


class PackProbe:
    def __init__(self, run: PackTraining, *, clock: Callable[[], float] = time.perf_counter):
        self.run, self.clock = run, clock
        self.compiled_forward: dict[Any, Any] = {}

    def measure(self, plan: Plan, *, timed_steps: int, check: bool, limit: float | None = None) -> Measurement:
        run, started = self.run, self.clock()
        saved_precision, saved_forward, saved_compiled = run.precision, getattr(run, "forward", None), run.compiled
        try:
            with backend_flags(plan), preserved(run), deadline(limit):
                setup = self._apply(plan)
                stream = _step_stream(run)
                losses = []
                for index in range(CHECK_STEPS if check else 1):
                    tick = self.clock()
                    run.loss_sum.zero_()
                    self._advance(next(stream))
                    if check:
                        losses.append(float(run.loss_sum.sum()))  # a sync: the probe's, never the training's
                    if index == 0 and run.compiled:
                        synchronize(run.device)
                        setup += self.clock() - tick
                synchronize(run.device)
                tick = self.clock()
                for _ in range(timed_steps):
                    self._advance(next(stream))
                synchronize(run.device)
                step_s = (self.clock() - tick) / timed_steps
            return Measurement(step_s, tuple(losses), setup, self.clock() - started)
        except Exception as error:  # noqa: BLE001 - a candidate that fails is dropped with its reason
            text = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
            return Measurement(None, cost_s=self.clock() - started, error=f"{type(error).__name__}: {text}" if text else type(error).__name__)
        finally:
            run.graph = None
            run.precision = saved_precision
            run.forward, run.compiled = saved_forward, saved_compiled  # type: ignore[attr-defined]
            run.optimizer.zero_grad()

    def release(self) -> None:
        """Compiled forwards are kept: compiling again would cost as much as the first time."""

    def _apply(self, plan: Plan) -> float:
        tick = self.clock()
        run = self.run
        run.precision = Precision(plan.precision.value, run.device, loss_scaling=plan.grad_scaler.value, masked=True)
        if plan.compile.value:
            if plan.compile.value not in self.compiled_forward:
                run.use_compiled(plan.compile.value)
                self.compiled_forward[plan.compile.value] = run.forward  # type: ignore[attr-defined]
            run.forward, run.compiled = self.compiled_forward[plan.compile.value], True  # type: ignore[attr-defined]
        else:
            run.use_eager()
        if plan.step_graph.value:
            graph, how = capture_step(run.step, lambda: preserved(run), run.optimizer.zero_grad, run.device)
            if graph is None:
                raise RuntimeError(how)
            run.graph = graph
        return self.clock() - tick

    def _advance(self, batch: tuple[torch.Tensor, int]) -> None:
        self.run.load_batch(*batch)
        if self.run.graph is not None:
            self.run.graph.replay()
        else:
            self.run.step()


def configure(run: PackTraining, plan: Plan) -> Plan:
    """Apply the finished plan to the pack: its precision, compiled forward and captured step. A
    capture that fails leaves eager steps, with the reason in the returned plan."""
    run.precision = Precision(plan.precision.value, run.device, loss_scaling=plan.grad_scaler.value, masked=True)
    if plan.compile.value:
        run.use_compiled(plan.compile.value)
    else:
        run.use_eager()
    if plan.step_graph.value:
        graph, how = capture_step(run.step, lambda: preserved(run), run.optimizer.zero_grad, run.device)
        if graph is None:
            return plan.replace(step_graph=Choice(False, how))
        run.graph = graph
        for events in run.events:
            events.append(f"step graph: {how}")
    return plan


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
    """Put back everything trial steps change: weights, optimizer moments, steps and lr, a schedule's step counts,
    loss scale, the epoch's loss sums, RNGs."""
    optimizer = run.optimizer
    live = [*run.fused.state_dict().values(), *optimizer.state_tensors(), *run.precision.device_state(),
            run.loss_sum, run.finite, *([run.schedule.taken] if run.schedule is not None else [])]
    saved = [t.detach().clone() for t in live]
    try:
        with preserved_rng(run.device):
            yield
    finally:
        with torch.no_grad():
            for tensor, copy in zip(live, saved, strict=True):
                tensor.copy_(copy)
        optimizer.zero_grad()
