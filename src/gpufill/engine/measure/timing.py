"""The batches measurements time real optimizer steps on: their own order, so the training's stays untouched.

Callers put the model and optimizer back afterwards (`engine/snapshot.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

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
