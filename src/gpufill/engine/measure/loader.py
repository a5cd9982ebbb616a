"""DataLoader settings chosen by measuring batches/s, for data that is not resident.

Rules of thumb ("num_workers = 8") ignore how heavy the Dataset is and how many cores
are free. Each candidate is timed on real batches (after its workers have started) and
the fastest wins. On a CPU the workers compete with the training for cores, so at most
half the cores are offered.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from torch.utils.data import DataLoader, Dataset

from gpufill.engine.hardware import Hardware
from gpufill.engine.plan import Choice, LoaderSettings

# Batches timed per candidate after the first (which includes worker start-up).
MEASURED_BATCHES = 20


def loader_candidates(hardware: Hardware) -> list[LoaderSettings]:
    """No workers, then powers of two up to the spare cores; pinned memory only where there is a GPU to copy to."""
    spare = hardware.cpu_count - 1 if hardware.is_cuda else hardware.cpu_count // 2
    counts = [0] + [2**i for i in range(4) if 2**i <= min(spare, 8)]
    candidates = []
    for workers in counts:
        for prefetch in (2, 4) if workers else (None,):
            candidates.append(
                LoaderSettings(num_workers=workers, prefetch_factor=prefetch, pin_memory=hardware.is_cuda, persistent_workers=workers > 0)
            )
    return candidates


def batches_per_second(dataset: Dataset, batch: int, settings: LoaderSettings, batches: int = MEASURED_BATCHES) -> float:
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, **asdict(settings))
    iterator = iter(loader)
    next(iterator)  # worker start-up is paid once per training with persistent workers: not timed
    tick, count = time.perf_counter(), 0
    for _ in range(batches):
        if next(iterator, None) is None:
            break
        count += 1
    elapsed = time.perf_counter() - tick
    del iterator, loader  # shut the workers down before the next candidate
    return count / elapsed if elapsed > 0 and count else 0.0


def tune_loader(dataset: Dataset, batch: int, hardware: Hardware) -> Choice[LoaderSettings]:
    measured = [(batches_per_second(dataset, batch, settings), settings) for settings in loader_candidates(hardware)]
    rate, best = max(measured, key=lambda pair: pair[0])
    table = ", ".join(f"{_describe(s)}: {r:.3g}/s" for r, s in measured)
    return Choice(best, f"measured fastest of {len(measured)} loader settings ({_describe(best)}, {rate:.3g} batches/s; {table})")


def _describe(settings: LoaderSettings) -> str:
    if not settings.num_workers:
        return "0 workers"
    return f"{settings.num_workers} workers x prefetch {settings.prefetch_factor}"
