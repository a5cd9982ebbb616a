"""TrainingMonitor: step times, throughput, data-wait share and GPU utilisation of one training.

Use it in any loop::

    monitor = TrainingMonitor(sampler=Sampler(gpu_source="auto"))
    with monitor:                                   # start() ... stop()
        for x, y in loader:
            with monitor.step(samples=len(x)) as step:
                ...                                 # forward, backward, optimiser step
    monitor.summary()  # {"samples_per_s": ..., "step_s_p95": ..., "gpu_util_mean": ...}

or feed it ``log_iteration(seconds, samples=..., data_wait_s=...)`` with times you took
yourself. :class:`NullMonitor` has the same methods and does nothing, so a loop never
branches on "is monitoring on". :class:`MonitorCallback` feeds a monitor from
``gpufill.fit`` (one iteration per epoch).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from gpufill.engine.result import EpochRecord, FitCallback
from gpufill.monitor.sampler import Sampler

__all__ = ["MonitorCallback", "NullMonitor", "Step", "TrainingMonitor"]

SUMMARY_KEYS = ("iterations", "samples", "samples_per_s", "step_s_mean", "step_s_p50", "step_s_p95",
                "data_wait_share", "gpu_util_mean", "wall_s")


class Step:
    """Handle yielded by ``monitor.step()``: ``with step.waiting():`` counts data-wait time."""

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self.data_wait_s = 0.0

    @contextmanager
    def waiting(self) -> Iterator[None]:
        tick = self._clock()
        try:
            yield
        finally:
            self.data_wait_s += self._clock() - tick


class TrainingMonitor:
    """Collects per-iteration times; with a sampler, also the GPU utilisation between start and stop.

    A sampler that is not running is started by ``start()`` and stopped by ``stop()``; one
    already running (a campaign's) is only listened to.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sampler: Sampler | None = None):
        self.clock = clock
        self.sampler = sampler
        # array('d'): 8 bytes per step, so a million-step run costs 8 MB, not a list of floats.
        self._seconds = array("d")
        self._samples = 0
        self._data_wait = 0.0
        self._gpu_util: list[float] = []
        self._started: float | None = None
        self._stopped: float | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._owns_sampler = False

    @property
    def started(self) -> bool:
        return self._started is not None

    def start(self) -> TrainingMonitor:
        self._started, self._stopped = self.clock(), None
        if self.sampler is not None and self._unsubscribe is None:
            self._unsubscribe = self.sampler.subscribe(self._on_rows)
            if not self.sampler.running:
                self._owns_sampler = True
                self.sampler.start()  # its first sample is taken at once
        return self

    def stop(self) -> None:
        if self._started is not None and self._stopped is None:
            self._stopped = self.clock()
        if self._owns_sampler and self.sampler is not None:
            self.sampler.stop()
            self._owns_sampler = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __enter__(self) -> TrainingMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_rows(self, rows: list[dict[str, Any]]) -> None:
        # Runs on the sampler's thread; list.extend is atomic under the GIL.
        self._gpu_util.extend(float(r["gpu_util"]) for r in rows if r["source"].startswith("gpu") and r["gpu_util"] is not None)

    def log_iteration(self, seconds: float, samples: int = 0, data_wait_s: float = 0.0) -> None:
        """One training step (or epoch) that took ``seconds``, of which ``data_wait_s`` waiting for data."""
        self._seconds.append(float(seconds))
        self._samples += int(samples)
        self._data_wait += float(data_wait_s)

    @contextmanager
    def step(self, samples: int = 0) -> Iterator[Step]:
        """Times the block as one iteration; ``with step.waiting():`` inside marks data-wait time."""
        handle = Step(self.clock)
        tick = self.clock()
        try:
            yield handle
        finally:
            self.log_iteration(self.clock() - tick, samples, handle.data_wait_s)

    def summary(self) -> dict[str, Any]:
        """Step statistics (seconds), throughput over step time, GPU utilisation (%, None without GPU rows)."""
        n = len(self._seconds)
        total = float(sum(self._seconds))
        times = np.frombuffer(self._seconds, dtype=np.float64) if n else None
        end = self._stopped if self._stopped is not None else self.clock()
        return {
            "iterations": n,
            "samples": self._samples,
            "samples_per_s": self._samples / total if total > 0 else None,
            "step_s_mean": total / n if n else None,
            "step_s_p50": float(np.percentile(times, 50)) if n else None,  # linear interpolation between ranks
            "step_s_p95": float(np.percentile(times, 95)) if n else None,
            "data_wait_share": self._data_wait / total if total > 0 else None,
            "gpu_util_mean": float(np.mean(self._gpu_util)) if self._gpu_util else None,
            "wall_s": end - self._started if self._started is not None else None,
        }


class NullMonitor:
    """Same methods as :class:`TrainingMonitor`, doing nothing."""

    started = False

    def start(self) -> NullMonitor:
        return self

    def stop(self) -> None:
        pass

    def __enter__(self) -> NullMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def log_iteration(self, seconds: float, samples: int = 0, data_wait_s: float = 0.0) -> None:
        pass

    @contextmanager
    def step(self, samples: int = 0) -> Iterator[Step]:
        yield _NULL_STEP

    def summary(self) -> dict[str, Any]:
        return {**dict.fromkeys(SUMMARY_KEYS), "iterations": 0, "samples": 0}


class _NullStep(Step):
    def __init__(self) -> None:
        super().__init__(lambda: 0.0)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        yield


_NULL_STEP = _NullStep()


class MonitorCallback(FitCallback):
    """Feeds a monitor from ``gpufill.fit``: one iteration per epoch (its training seconds).

    The caller starts and stops the monitor (``with monitor: fit(...)``) for wall time and
    GPU utilisation; iterations are logged either way.
    """

    def __init__(self, monitor: TrainingMonitor | NullMonitor, samples_per_epoch: int = 0):
        self.monitor = monitor
        self.samples_per_epoch = samples_per_epoch

    def on_epoch_end(self, record: EpochRecord) -> None:
        self.monitor.log_iteration(record.seconds, samples=self.samples_per_epoch)
