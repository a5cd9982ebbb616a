"""Batch search: measure samples/s at a few batch sizes and keep the fastest that fits.

The largest batch that fits is not the fastest one: past the point where the device is
busy, a bigger batch only costs memory, and on a CPU a smaller one can keep the working
set in cache. So the search walks powers of two up from a start value, stops when a
size runs out of memory, crosses the memory budget or has clearly passed the peak, then
tries the two midpoints around the best power of two.

The search is pure: `measure(size)` does the real steps (see fit.py), so the same
logic runs on a fake cost model in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpufill.errors import InputError

# Stop walking up after this many sizes in a row that are not faster than the best.
PATIENCE = 2
# Sizes within this share of the best throughput count as a tie; ties go to the smaller size
# (less memory, and with a kept effective batch fewer padding effects).
TIE = 0.02


@dataclass(frozen=True, slots=True)
class BatchTrial:
    """One measured size: throughput and peak memory, or out of memory."""

    size: int
    samples_per_s: float | None
    """None when the size ran out of memory."""
    peak_bytes: int | None = None
    """Peak device memory during the steps (None where it cannot be measured, e.g. CPU)."""

    def fits(self, budget_bytes: int | None) -> bool:
        if self.samples_per_s is None:
            return False
        return budget_bytes is None or self.peak_bytes is None or self.peak_bytes <= budget_bytes


@dataclass(frozen=True, slots=True)
class BatchSearchResult:
    best: BatchTrial
    trials: tuple[BatchTrial, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"best": asdict(self.best), "trials": [asdict(t) for t in self.trials]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchSearchResult:
        return cls(best=BatchTrial(**data["best"]), trials=tuple(BatchTrial(**t) for t in data["trials"]))

    def summary(self) -> str:
        """"16: 9.1k/s, 32: 12k/s, 64: oom" — what was measured, for the plan's reason."""
        parts = []
        for trial in sorted(self.trials, key=lambda t: t.size):
            rate = "out of memory" if trial.samples_per_s is None else f"{_short(trial.samples_per_s)}/s"
            parts.append(f"{trial.size}: {rate}")
        return ", ".join(parts)


def candidate_sizes(start: int, limit: int) -> list[int]:
    """Powers of two from `start` up to `limit`, and `limit` itself (the user's batch) if it is not one."""
    if start < 1 or limit < 1:
        raise ValueError("batch sizes must be positive")
    sizes, size = [], min(start, limit)
    while size < limit:
        sizes.append(size)
        size *= 2
    return [*sizes, limit]


def search_batch(measure: Callable[[int], BatchTrial], *, start: int, limit: int, budget_bytes: int | None) -> BatchSearchResult:
    """The fastest measured size within `budget_bytes` (every measured size is <= `limit`)."""
    trials: dict[int, BatchTrial] = {}
    best: BatchTrial | None = None
    not_better = 0
    for size in candidate_sizes(start, limit):
        trial = trials[size] = measure(size)
        if not trial.fits(budget_bytes):
            break  # a larger size only needs more memory
        if best is None or _faster(trial, best):
            best, not_better = trial, 0
        else:
            not_better += 1
            if not_better >= PATIENCE:
                break
    if best is None:
        first = trials[min(trials)]
        raise InputError(
            f"even a batch of {first.size} does not fit in the memory budget",
            field="batch_size",
            fix="lower micro_batch, use a smaller model, or raise memory_margin",
        )
    for size in (best.size * 3 // 4, best.size * 3 // 2):  # refine between the powers of two
        if start <= size <= limit and size not in trials:
            trial = trials[size] = measure(size)
            if trial.fits(budget_bytes) and _faster(trial, best):
                best = trial
    return BatchSearchResult(best=best, trials=tuple(trials.values()))


def _faster(trial: BatchTrial, best: BatchTrial) -> bool:
    assert trial.samples_per_s is not None and best.samples_per_s is not None
    margin = 1 + TIE if trial.size > best.size else 1 - TIE
    return trial.samples_per_s > best.samples_per_s * margin


def _short(rate: float) -> str:
    return f"{rate / 1000:.3g}k" if rate >= 1000 else f"{rate:.3g}"
