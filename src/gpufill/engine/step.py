"""One optimizer step, one epoch, one validation pass: the hot loop, free of host-device syncs.

A step runs the loss over the effective batch in micro-batches, each weighted by its share
of the batch, so k accumulated micro-batches give exactly one batch's gradient (a short
last batch too, and under DDP ranks whose shares differ by one give exactly the global
batch's). The loss and metrics accumulate on the device, weighted by sample count, and
are read once per epoch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from gpufill.engine.backend import is_out_of_memory
from gpufill.engine.batches import Batches, EffectiveBatch
from gpufill.engine.config import FitConfig
from gpufill.engine.distributed import Distributed
from gpufill.engine.plan import Plan
from gpufill.engine.precision import Precision
from gpufill.errors import InputError

T = TypeVar("T")

Values = dict[str, torch.Tensor]


class Training(Protocol):
    """What the hot loop reads and calls on the loop's Training (loop.py)."""

    model: nn.Module
    forward: Any
    """The prepared model: compiled and/or DDP-wrapped."""
    evaluate: Any
    """The model validation runs through (never the DDP wrapper)."""
    loss_fn: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    plan: Plan
    cfg: FitConfig
    device: torch.device
    generator: torch.Generator
    ddp: Distributed | None
    ddp_module: nn.parallel.DistributedDataParallel | None
    monitor: Any
    timing: dict[str, float]
    compiled: bool
    first_step_done: bool

    def recover_from_oom(self) -> None: ...
    def fall_back_to_eager(self, error: BaseException) -> None: ...


class Totals:
    """Per-metric sums on the device, weighted by sample count; `read` is the one sync."""

    def __init__(self, device: torch.device):
        self.device = device
        self.sums: Values = {}
        self.samples = 0

    def add(self, values: Values, weight: float, samples: int) -> None:
        for name, value in values.items():
            total = self.sums.get(name)
            if total is None:
                total = self.sums[name] = torch.zeros((), device=self.device)
            total.add_(value.detach(), alpha=weight)
        self.samples += samples

    def read(self, training: Training) -> dict[str, float]:
        """Means over the samples (summed over DDP ranks first), read in one transfer."""
        names = list(self.sums)
        stacked = torch.stack([*(self.sums[n].float() for n in names), torch.tensor(float(self.samples), device=self.device)])
        if training.ddp is not None:  # every rank must see the same numbers to take the same decisions
            stacked = training.ddp.sum(stacked)
        *sums, samples = stacked.tolist()
        self.samples = int(samples)
        return {name: value / max(samples, 1) for name, value in zip(names, sums, strict=True)}


def train_epoch(training: Training, batches: Batches) -> tuple[dict[str, float], int]:
    """One pass of optimizer steps; (mean loss and metrics, samples seen over all ranks)."""
    t = training
    t.model.train()
    totals = Totals(t.device)
    batch_iter = batches.epoch(t.plan.effective_batch.value, t.generator)
    while True:
        tick = time.perf_counter()
        batch = next(batch_iter, None)
        wait = time.perf_counter() - tick
        t.timing["data_s"] += wait
        if batch is None:
            break
        values, weight = step_with_retry(t, batch)
        if t.plan.step_sync.value:
            values["loss"].item()  # the logging loops' per-step read, kept only when asked for
        totals.add(values, weight, batch.size)
        t.monitor.log_iteration(time.perf_counter() - tick, samples=batch.size, data_wait_s=wait)
    means = totals.read(t)
    return means, totals.samples


def step_with_retry(t: Training, batch: EffectiveBatch) -> tuple[Values, float]:
    """One optimizer step; on OOM halve the micro-batch, double accumulation, retry the same samples."""
    while True:
        try:
            outcome = optimizer_step(t, batch)
            t.first_step_done = True
            return outcome
        except Exception as error:
            t.optimizer.zero_grad(set_to_none=True)
            if is_out_of_memory(error) and t.plan.micro_batch.value > 1:
                t.recover_from_oom()
            elif t.compiled and not t.first_step_done and not isinstance(error, InputError):
                t.fall_back_to_eager(error)
            elif not t.first_step_done and (converted := _as_input_error(error, "train")) is not error:
                raise converted from None
            else:
                raise


def optimizer_step(t: Training, batch: EffectiveBatch) -> tuple[Values, float]:
    """One optimizer step over `batch` in micro-batches; (values, weight) with values x weight
    the step's sample-weighted sums, on the device (the epoch adds them with one add_ each)."""
    micro = t.plan.micro_batch.value
    parts = batch.micro_batches(micro)
    if batch.rows <= micro:  # the usual case: one forward/backward, no accumulator
        part, rows = next(parts)
        values, weight = _forward_backward(t, part, rows, batch)
    else:
        values, weight = {}, 1.0
        for (part, rows), last in _with_last(parts):
            # Under DDP gradients are averaged across ranks once per optimizer step, not per micro-batch.
            with t.ddp_module.no_sync() if t.ddp_module is not None and not last else contextlib.nullcontext():
                part_values, count = _forward_backward(t, part, rows, batch)
            for name, value in part_values.items():
                values[name] = value.detach() * count if name not in values else values[name].add(value.detach(), alpha=count)
    if t.cfg.grad_clip is not None:
        t.precision.unscale_(t.optimizer)
        nn.utils.clip_grad_norm_(t.model.parameters(), t.cfg.grad_clip, foreach=t.device.type == "cuda")
    t.precision.step(t.optimizer)
    if t.scheduler is not None:
        t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    return values, weight


def _forward_backward(t: Training, part: Any, rows: int, batch: EffectiveBatch) -> tuple[Values, int]:
    """Forward and backward of one micro-batch; (its mean loss and metrics, the samples it counts)."""
    with t.precision.autocast():
        values = t.loss_fn(t.forward, part)
    loss = values["loss"]
    # Weighting each micro-batch mean by its share makes k accumulated micro-batches give
    # exactly the gradient of one batch (see the module docstring).
    share = rows / batch.loss_denominator
    t.precision.backward(loss if share == 1.0 else loss * share)
    return values, min(rows, batch.size)  # a stand-in sample counts 0


@torch.no_grad()
def validate(t: Training, batches: Batches) -> dict[str, float]:
    """Mean loss and metrics over the validation data, through the bare (or compiled) model."""
    tick = time.perf_counter()
    t.model.eval()
    totals = Totals(t.device)
    # No activations kept for backward, so validation can use larger batches.
    for part, rows in batches.in_order(max(4 * t.plan.micro_batch.value, 1024)):
        with t.precision.autocast():
            values = t.loss_fn(t.evaluate, part)
        totals.add(values, rows, rows)
    means = totals.read(t)
    t.timing["val_s"] += time.perf_counter() - tick
    return means


def _as_input_error(error: BaseException, name: str) -> BaseException:
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
