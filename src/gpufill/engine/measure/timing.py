"""Timing real optimizer steps for the measured choices (batch search, compile).

This is a profiling mode: it synchronises the device to read honest times, which the
training loop itself never does. Callers wrap it in `state.preserved` so the steps
leave the model and optimizer as they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from gpufill.engine.backend import synchronize
from gpufill.engine.measure.batch import BatchTrial

# Each measurement: at least this many timed steps and this much time, at most MAX_STEPS.
MIN_STEPS = 3
MIN_SECONDS = 0.05
MAX_STEPS = 20
# Batch order during measurements comes from its own generator: the training's stays untouched.
MEASURE_SEED = 1234


class Batches(Protocol):
    n: int | None

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[Any]: ...


def batch_stream(batches: Batches, effective: int, device: torch.device) -> Iterator[Any]:
    """Effective batches without end (epoch after epoch)."""
    generator = torch.Generator(device=device).manual_seed(MEASURE_SEED)
    while True:
        yield from batches.epoch(effective, generator)


def seconds_per_step(step: Callable[[Any], Any], stream: Iterator[Any], device: torch.device) -> float:
    """Median-free mean over enough steps to rise above timer noise (the first, warm-up step excluded)."""
    step(next(stream))
    synchronize(device)
    tick, count = time.perf_counter(), 0
    while count < MAX_STEPS:
        step(next(stream))
        count += 1
        if count >= MIN_STEPS:
            synchronize(device)
            if time.perf_counter() - tick >= MIN_SECONDS:
                break
    synchronize(device)
    return (time.perf_counter() - tick) / count


def measure_batch(step: Callable[[Any], Any], batches: Batches, *, size: int, effective: int, device: torch.device,
                  is_oom: Callable[[BaseException], bool]) -> BatchTrial:
    """samples/s and peak memory of optimizer steps over effective batches split into micro-batches of `size`."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        per_step = seconds_per_step(step, batch_stream(batches, effective, device), device)
    except Exception as error:
        if not is_oom(error):
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return BatchTrial(size=size, samples_per_s=None)
    samples = effective if batches.n is None else min(effective, batches.n)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return BatchTrial(size=size, samples_per_s=samples / per_step, peak_bytes=peak)
