"""The thread trial a doctor runs inside a CPU training after its measured steps: the same training
stepped in interleaved blocks at the script's own torch thread count and at fewer threads.

Why measure instead of reading the load: on a busy box torch's default (one intra-op thread per
core) can be many times slower than one thread, because each operator ends at a barrier that
waits for every thread, and one descheduled thread stalls them all; on an idle many-core box the
same setting is the fastest. Only the training itself, timed both ways on this machine and at
this moment, says which. Runs in the user's process (recorder.py): host clock, nothing but
`torch.set_num_threads` between blocks, the script's own thread count put back at the end.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 4
"""Rounds of one block per arm; the arms' order alternates round by round (ABBA...)."""
BLOCK = 3
"""Steps per block; the first of each is dropped (the thread pool changing size is paid there)."""
MIN_ROUNDS = 2
FAR_SLOWER = 2.0
"""A fewer-thread arm this many times slower than the script's in the first round ends the trial there."""
BUDGET_S = 30.0
"""After MIN_ROUNDS, no new round starts past this many seconds of trial (a slow step at one thread)."""


def trial_arms(threads: int, usable_cores: int) -> list[int]:
    """The script's thread count first, then one thread, and the usable cores where they lie between."""
    arms = [threads, 1]
    if 1 < usable_cores < threads:
        arms.append(usable_cores)
    return arms


class ThreadTrial:
    """Interleaved blocks of steps per thread count; `after_step()` after each optimizer step, True when done."""

    def __init__(self, torch: Any, threads: int, usable_cores: int, *, rounds: int = ROUNDS, block: int = BLOCK, budget_s: float = BUDGET_S,
                 clock: Callable[[], float] = time.perf_counter, set_threads: Callable[[int], None] | None = None):
        self.torch, self.threads, self.usable_cores, self.clock = torch, threads, usable_cores, clock
        self.set_threads = set_threads or torch.set_num_threads
        """engine/backend.py's `set_threads` in a script: torch's own call would leave MKL slower for the rest of it."""
        self.arms = trial_arms(threads, usable_cores)
        self.block, self.budget_s = block, budget_s
        self.schedule = [(r, arm) for r in range(rounds) for arm in (self.arms if r % 2 == 0 else self.arms[::-1])]
        self.step_s: list[dict[int, list[float]]] = [{arm: [] for arm in self.arms} for _ in range(rounds)]
        """Per round, per thread count: the block's step times (its first step dropped)."""
        self.position = self.in_block = 0
        self.started = self.last = clock()

    def start(self) -> None:
        self.set_threads(self.schedule[0][1])
        self.started = self.last = self.clock()

    def after_step(self) -> bool:
        now = self.clock()
        round_, arm = self.schedule[self.position]
        if self.in_block > 0:
            self.step_s[round_][arm].append(now - self.last)
        self.last = now
        self.in_block += 1
        if self.in_block < self.block:
            return False
        self.position, self.in_block = self.position + 1, 0
        finished_round = self.position % len(self.arms) == 0
        over_budget = finished_round and self.position // len(self.arms) >= MIN_ROUNDS and now - self.started > self.budget_s
        if self.position == len(self.schedule) or over_budget or (self.position == len(self.arms) and self._fewer_is_far_slower()):
            self.finish()
            return True
        self.set_threads(self.schedule[self.position][1])
        return False

    def _fewer_is_far_slower(self) -> bool:
        """After the first round: every fewer-thread arm took over FAR_SLOWER times the script's step (an idle many-core
        machine, where a slow single-threaded step would make the trial take minutes): nothing to gain, stop."""
        first = self.step_s[0]
        mine = statistics.median(first[self.threads]) if first[self.threads] else None
        return mine is not None and all(first[arm] and statistics.median(first[arm]) > FAR_SLOWER * mine for arm in self.arms[1:])

    def finish(self) -> None:
        self.set_threads(self.threads)

    def to_dict(self) -> dict[str, Any]:
        done = [r for r in self.step_s if all(r[arm] for arm in self.arms)]
        return {"arms": self.arms, "block": self.block, "rounds": [{str(arm): [round(s, 6) for s in r[arm]] for arm in self.arms} for r in done]}


def affinity() -> list[int] | None:
    """The CPU ids this process may run on (None where the platform does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and its children (DataLoader workers): the training's own use of the cores."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # it ended meanwhile
            continue
    return total
