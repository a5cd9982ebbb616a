"""Timing real optimizer steps for the measured choices: the batches they run on, and seconds per step.

This is a profiling mode: it synchronises the device to read honest times, which the
training loop itself never does. Callers put the model and optimizer back afterwards
(`engine/snapshot.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from gpufill.engine.backend import synchronize

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
