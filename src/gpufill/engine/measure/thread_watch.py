"""A CPU training's thread count, re-checked while it trains when its step drifts.

The thread count a training starts with was measured over a few steps. On a machine whose other processes come and go,
a step at every core stalls at each operator's barrier once another process holds a core (10x slower on a 2-core box
with two busy processes), and a choice measured in a quiet second is wrong a second later. `ThreadWatch` is told each
step's seconds; when the recent steps (most of the last WINDOW) run DRIFT times slower than the step the count was
chosen on, the next steps run one at each other thread count and the training goes on at the fastest. A re-check that
keeps the count doubles the wait before the next one: on a machine that stays loaded, a stalled count is tried again
more and more rarely, so re-checking costs a bounded share of the training. The steps timed are the training's own.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpufill.engine.backend import set_threads
from gpufill.engine.hardware import cpu_count
from gpufill.engine.measure.candidates import thread_counts
from gpufill.engine.measure.resolver import PROBE_MIN_STEPS

if TYPE_CHECKING:
    import torch

    from gpufill.engine.config import FitConfig

DRIFT = 2.0
"""Re-check once the recent steps run this many times slower than the step the thread count was chosen on."""
WINDOW = 4
"""Steps whose mean is "the recent steps": a stall in every few steps costs as much as steady slowness (on a 2-core box
with two busy processes, 2-thread steps ran 9-15 ms with a 90-110 ms stall every 5-15 steps); a one-off 3x step is not
DRIFT."""
COOLDOWN = 16
"""Steps after a re-check before the next; doubled after each re-check that keeps the count."""


class ThreadWatch:
    """Watches one training's steps; `observe(seconds)` after each, and the next step runs at `threads`."""

    def __init__(self, counts: Sequence[int], threads: int, reference_s: float | None,
                 set_threads: Callable[[int], None] = set_threads):
        self.counts = list(dict.fromkeys([threads, *counts]))
        self.threads = threads
        """The count the steps run at between re-checks."""
        self.reference_s = reference_s
        """The step the current count was chosen on (seconds); None: the mean of the first WINDOW steps watched."""
        self.set_threads = set_threads
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.queue: list[int] = []
        """The counts still to time in a re-check (one step each)."""
        self.trial: dict[int, float] = {}
        self.cooldown = COOLDOWN
        self.since = COOLDOWN
        """Steps since the last re-check; the first may come as soon as WINDOW steps are watched."""
        self.log: list[str] = []
        """What each re-check measured and chose, in words: the training's events."""

    @classmethod
    def for_training(cls, threads: int, cfg: FitConfig, device: torch.device, *, distributed: bool, total_steps: int | None) -> ThreadWatch | None:
        """A watch over a CPU training's thread count (now `threads`) where gpufill measures it: threads and the probe
        left to it, a training long enough for the probe (not under DDP: its ranks share the cores by design). Its
        reference is the first steps' own time: the probe measured under the load it saw, and so do they."""
        if device.type != "cpu" or cfg.threads != "auto" or cfg.probe is False or distributed:
            return None
        if total_steps is None or total_steps < PROBE_MIN_STEPS:
            return None
        watch = cls(thread_counts(threads, cpu_count()), threads, None)
        return watch if watch.active else None

    @property
    def active(self) -> bool:
        """Anything to choose between (a CPU training with threads left to gpufill)."""
        return len(self.counts) > 1

    def observe(self, seconds: float) -> None:
        """The step just run took `seconds`; sets the thread count for the next one."""
        if not self.active:
            return
        self.since += 1
        if self.queue:  # a re-check: this step ran at the queue's first count
            self.trial[self.queue.pop(0)] = seconds
            if self.queue:
                self.set_threads(self.queue[0])
            else:
                self._choose()
            return
        self.recent.append(seconds)
        if len(self.recent) < WINDOW:
            return
        recent = statistics.fmean(self.recent)  # the time the steps cost: a count that stalls one step in four costs 3x
        if self.reference_s is None:  # nothing measured before: the first steps watched are the reference
            self.reference_s = recent
        if self.since < self.cooldown:
            return
        if recent >= DRIFT * self.reference_s:  # twice the chosen step: a step that doubled is drift
            self.trial = {self.threads: recent}
            self.queue = [t for t in self.counts if t != self.threads]
            self.set_threads(self.queue[0])

    def _choose(self) -> None:
        was, drifted = self.threads, self.trial[self.threads]
        best = min(self.trial, key=self.trial.__getitem__)
        self.threads, self.reference_s = best, self.trial[best]
        self.set_threads(best)
        self.recent.clear()
        self.since = 0
        self.cooldown = COOLDOWN if best != was else 2 * self.cooldown
        measured = ", ".join(f"{t}: {s * 1e3:.3g} ms" for t, s in sorted(self.trial.items()))
        verdict = f"went on at {best}" if best != was else f"kept {was}; next re-check after {self.cooldown} steps"
        self.log.append(f"step drifted to {drifted * 1e3:.3g} ms at {was} thread{'s' if was > 1 else ''}; re-measured ({measured}): {verdict}")
