"""One optimizer step, one epoch, one validation pass: the hot loop, free of host-device syncs.

A step runs the loss over the effective batch in micro-batches, each weighted by its share
of the batch, so k accumulated micro-batches give exactly one batch's gradient (a short
last batch too, and under DDP ranks whose shares differ by one give exactly the global
batch's). The loss and metrics accumulate on the device, weighted by sample count, and
are read once per epoch.

What a step costs beside the careful hand loop's (one thread of a 2-core EPYC,
`bench/step_overhead.py --quick`, 2026-11-24): an operator costs ~5 us there, so the loss is not
added into the device sums each step but kept and summed once per KEEP_STEPS steps; the epoch's
batch generator ~2 us, the gather by index_select (faster than indexing: the hand loop's
`take` is ~11 us, ours ~7 us), the named loss's dict ~2.5 us (the hand loop pays it too in the
benchmarks), two clock reads ~0.3 us. An fp32 step without scaling, clipping or schedule takes
the plain path (no autocast context, no scaler indirection). Measured: gpufill's step 0.98x
the hand loop's time (linear 4->1 at batch 32) and 0.99x (the MLP forecaster at batch 128),
14.1 and 29.1 operators per step against 14 and 29. A captured step (`step_graph.py`)
launches all of it as one graph.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

from gpufill.engine.batches import Batches, EffectiveBatch
from gpufill.engine.distributed import Distributed
from gpufill.engine.precision import Precision
from gpufill.errors import InputError

T = TypeVar("T")

Values = dict[str, torch.Tensor]


KEEP_STEPS = 64
"""Eager steps' values are summed once per this many steps (`Totals.keep`): one stack and one add
instead of an add per step. An operator costs ~5 us on a small CPU, 2 % of a tiny model's step."""


class Totals:
    """Per-metric sums on the device, weighted by sample count; `read` is the one sync.

    The sums are made at the first step and zeroed in place after, so a captured step's
    additions land in the same tensors every epoch. Eager steps `keep` their values instead:
    the last KEEP_STEPS steps' tensors are held (their graphs already freed by backward) and
    summed together."""

    def __init__(self, device: torch.device):
        self.device = device
        self.sums: Values = {}
        self.samples = 0
        self.kept: dict[str, list[torch.Tensor]] = {}
        self.kept_weight = 0.0

    def add(self, values: Values, weight: float) -> None:
        for name, value in values.items():
            total = self.sums.get(name)
            if total is None:
                total = self.sums[name] = torch.zeros((), device=self.device)
            total.add_(value.detach(), alpha=weight)

    def keep(self, values: Values, weight: float) -> None:
        """`add`, deferred: no operator this step (steps of one weight are summed together)."""
        if weight != self.kept_weight or values.keys() != self.kept.keys():
            self._flush()
            self.kept_weight = weight
            self.kept = {name: [] for name in values}
        for name, value in values.items():
            self.kept[name].append(value)
        if len(self.kept[name]) >= KEEP_STEPS:
            self._flush()

    def _flush(self) -> None:
        if not self.kept or not next(iter(self.kept.values())):
            return
        with torch.no_grad():
            self.add({name: torch.stack(kept).sum(dtype=torch.float32) for name, kept in self.kept.items()}, self.kept_weight)
        for kept in self.kept.values():
            kept.clear()

    def reset(self) -> None:
        for kept in self.kept.values():
            kept.clear()
        for total in self.sums.values():
            total.zero_()
        self.samples = 0

    def read(self, ddp: Distributed | None = None) -> dict[str, float]:
        """Means over the samples (summed over DDP ranks first), read in one transfer."""
        self._flush()
        names = list(self.sums)
        stacked = torch.stack([*(self.sums[n].float() for n in names), torch.tensor(float(self.samples), device=self.device)])
        if ddp is not None:  # every rank must see the same numbers to take the same decisions
            stacked = ddp.sum(stacked)
        *sums, samples = stacked.tolist()
        self.samples = int(samples)
        return {name: value / max(samples, 1) for name, value in zip(names, sums, strict=True)}


@dataclass(eq=False, slots=True)
class EagerStep:
    """One optimizer step over an effective batch, launched op by op."""

    model: nn.Module
    forward: Callable[[Any], Any]
    """The prepared model: compiled and/or DDP-wrapped."""
    loss_fn: Callable[[Any, Any], Values]
    optimizer: torch.optim.Optimizer
    precision: Precision
    totals: Totals
    micro_batch: int
    grad_clip: float | None
    foreach_clip: bool = False
    scheduler: Any = None
    ddp_module: nn.parallel.DistributedDataParallel | None = None
    plain: bool = field(init=False)
    """fp32 without loss scaling or clipping: with no schedule, the hand loop's step without its indirections."""

    def __post_init__(self) -> None:
        self.plain = self.precision.dtype is None and not self.precision.loss_scaling and self.grad_clip is None

    def switch_precision(self, name: str) -> None:
        """Autocast to `name` from the next step on (`Precision.switch`)."""
        self.precision.switch(name)
        self.__post_init__()

    @torch.no_grad()
    def loss_at(self, batch: EffectiveBatch, precision: str) -> float:
        """The loss of `batch`'s first micro-batch at `precision`, eval mode (no dropout, no random draw), nothing updated."""
        was = self.precision.name
        training = self.model.training
        self.model.eval()
        try:
            self.precision.switch(precision)
            with self.precision.autocast():
                return float(self.loss_fn(self.forward, next(batch.micro_batches(self.micro_batch))[0])["loss"])
        finally:
            self.precision.switch(was)
            self.model.train(training)

    def __call__(self, batch: EffectiveBatch) -> torch.Tensor:
        """The step; its loss and metrics are added to `totals`. Returns the loss (on the device)."""
        parts = batch.micro_batches(self.micro_batch)
        if self.plain and self.scheduler is None and batch.rows <= self.micro_batch:  # the hand loop's calls and no other
            part, rows = next(parts)
            values = self.loss_fn(self.forward, part)
            loss = values["loss"]
            share = rows / batch.loss_denominator
            (loss if share == 1.0 else loss * share).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.totals.keep(values, min(rows, batch.size))
            return loss
        if batch.rows <= self.micro_batch:  # one forward/backward, no accumulator
            part, rows = next(parts)
            values, weight = self._forward_backward(part, rows, batch)
        else:
            values, weight = {}, 1.0
            for (part, rows), last in _with_last(parts):
                # Under DDP gradients are averaged across ranks once per optimizer step, not per micro-batch.
                with self.ddp_module.no_sync() if self.ddp_module is not None and not last else contextlib.nullcontext():
                    part_values, count = self._forward_backward(part, rows, batch)
                for name, value in part_values.items():
                    values[name] = value.detach() * count if name not in values else values[name].add(value.detach(), alpha=count)
        if self.grad_clip is not None:
            self.precision.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip, foreach=self.foreach_clip)
        self.precision.step(self.optimizer)
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.totals.keep(values, weight)
        return values["loss"]

    def _forward_backward(self, part: Any, rows: int, batch: EffectiveBatch) -> tuple[Values, int]:
        """Forward and backward of one micro-batch; (its mean loss and metrics, the samples it counts)."""
        with self.precision.autocast():
            values = self.loss_fn(self.forward, part)
        loss = values["loss"]
        # Weighting each micro-batch mean by its share makes k accumulated micro-batches give
        # exactly the gradient of one batch (see the module docstring).
        share = rows / batch.loss_denominator
        self.precision.backward(loss if share == 1.0 else loss * share)
        return values, min(rows, batch.size)  # a stand-in sample counts 0



@dataclass(slots=True)
class EpochTiming:
    data_s: float = 0.0
    """Time spent waiting for the next batch."""
    val_s: float = 0.0


LONG_PASS_STEPS = 100_000
LONG_PASS_S = 60.0
"""An unbounded pass of a stream of unknown length says so once it passes this many steps or seconds (then at each
doubling): reading a stream's code cannot find every endless loop (`itertools.cycle` returned, `while not False:`).
A minute: a user waiting on a pass that never ends hears why within it (600 s before); a long real pass is only told
how to bound it, never stopped."""


class EndlessStreamWarning(UserWarning):
    """A pass of a stream of unknown length, with nothing to bound it, goes on and on."""


@dataclass(slots=True)
class _LongPassGuard:
    """Says, in one line, that an unbounded pass may never end and how to bound it; checked once per step."""

    batches: Batches
    started: float
    next_steps: int
    next_s: float

    def check(self, steps: int, now: float) -> None:
        seconds = now - self.started
        if steps < self.next_steps and seconds < self.next_s:
            return
        self.next_steps, self.next_s = 2 * max(steps, self.next_steps), 2 * max(seconds, self.next_s)
        source = getattr(self.batches, "dataset", None) or getattr(getattr(self.batches, "loader", None), "dataset", None)
        name = type(source).__name__ if source is not None else "the training data"
        warnings.warn(f"train: one epoch of {name} has run {steps} steps in {seconds:.0f} s without ending; if its __iter__ never ends, "
                      f"set steps_per_epoch=N (optimizer steps per epoch) or max_steps=N (in all)", EndlessStreamWarning, stacklevel=2)


def _unbounded(batches: Batches, max_steps: int | None) -> bool:
    """A pass that only the data can end: no step limit, a length not known, no steps per epoch."""
    return max_steps is None and batches.n is None and getattr(batches, "steps", None) is None


def train_epoch(step: Callable[[EffectiveBatch], Any], batches: Batches, effective: int, generator: torch.Generator, totals: Totals, *,
                timing: EpochTiming, sync_every_step: bool = False, on_step: Callable[[float, int, float], None] | None = None,
                recover: Callable[[BaseException], bool] | None = None, max_steps: int | None = None,
                clock: Callable[[], float] = time.perf_counter) -> int:
    """One pass of optimizer steps (at most `max_steps`); returns how many were taken. `recover(error)` is asked
    about a failed step: True retries the same samples (an out-of-memory error halved the micro-batch), False re-raises.
    A pass only the data can end warns when it runs long (`_LongPassGuard`)."""
    totals.reset()
    batch_iter = batches.epoch(effective, generator)
    guard = _LongPassGuard(batches, clock(), LONG_PASS_STEPS, LONG_PASS_S) if _unbounded(batches, max_steps) else None
    steps = 0
    while max_steps is None or steps < max_steps:
        tick = clock()
        batch = next(batch_iter, None)
        wait = clock() - tick
        timing.data_s += wait
        if batch is None:
            break
        while True:
            try:
                loss = step(batch)
                break
            except Exception as error:
                if recover is None or not recover(error):
                    raise
        if sync_every_step and loss is not None:
            loss.item()  # the logging loops' per-step read, kept only when asked for
        totals.samples += batch.size
        steps += 1
        if on_step is not None:
            on_step(clock() - tick, batch.size, wait)
        if guard is not None:
            guard.check(steps, clock())
    return steps


@torch.no_grad()
def validate(evaluate: Callable[[Any], Any], model: nn.Module, loss_fn: Callable[[Any, Any], Values], precision: Precision,
             batches: Batches, micro_batch: int, device: torch.device, ddp: Distributed | None) -> dict[str, float]:
    """Mean loss and metrics over the validation data, through the bare (or compiled) model."""
    model.eval()
    totals = Totals(device)
    # No activations kept for backward, so validation can use larger batches.
    for part, rows in batches.in_order(max(4 * micro_batch, 1024)):
        with precision.autocast():
            values = loss_fn(evaluate, part)
        totals.add(values, rows)
        totals.samples += rows
    return totals.read(ddp)


def as_input_error(error: BaseException, name: str) -> BaseException:
    """The first step's type errors (integer inputs into float weights, a model that cannot take
    the batch's structure) as one line; anything else unchanged."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    dtype_words = ("expected scalar type", "same dtype", "found dtype", "expected both", "not implemented for", "must have the same")
    if isinstance(error, RuntimeError) and any(word in text.lower() for word in dtype_words):
        return InputError(f"the model could not run on a {name} batch: {text[:200]}", field=name,
                          fix="feed the model float tensors where it multiplies by weights (x.float()); integer ids go through an nn.Embedding")
    if isinstance(error, TypeError) and ("positional argument" in text or "argument" in text and "forward" in text):
        return InputError(f"the model could not take a {name} batch: {text[:200]}", field=name,
                          fix="pass loss=fn(model, batch) that calls the model with the batch's parts")
    return error


def _with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with whether it is the last (one item of look-ahead)."""
    iterator = iter(items)
    current = next(iterator, _END)
    while current is not _END:
        following = next(iterator, _END)
        yield current, following is _END
        current = following


_END: Any = object()
