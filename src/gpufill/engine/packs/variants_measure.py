"""`fit_many`'s measurement: the pack's own first training steps against one model alone, as the run pays them.

The pack is measured while it trains: its first steps are real training steps (the first one timed apart, its
one-time cost), and between them one step of a copy of variant 0 with the optimizer its `fit` would build is timed
on that model's rows of the same batch. Steady steps run at the plan's thread count until the answer is clear or a
share of the planned training is spent on the copy (`decide.MeasureBudget`); a CPU's other thread counts get one
step each right after the first steady one, and the steady steps go on at the fastest count so far. Where the pack would be slower in all, `PackSlower` stops it and
the variants train one at a time: only the measured steps are lost. The numbers are cached per model shape, batch,
K, optimizer and machine (`TuneCache`, in this process and in `tune_cache` when set): the next call of the same shape
decides before its first step.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from gpufill.engine.backend import set_threads, synchronize
from gpufill.engine.batches import map_tensors
from gpufill.engine.choice import Choice
from gpufill.engine.measure.cache import TuneCache, shape_key, validated
from gpufill.engine.measure.resolver import MIN_GAIN
from gpufill.engine.packs.decide import MeasureBudget, PackTiming, decide
from gpufill.engine.packs.variants import PackedVariants


class PackSlower(Exception):
    """The measured pack would be slower in all than its variants one at a time: why, and the seconds the measuring
    cost (the copy's steps and the pack's, which are thrown away)."""

    def __init__(self, reason: str, spent_s: float):
        super().__init__(reason)
        self.spent_s = spent_s


def cached_timing(run: PackedVariants, cache: TuneCache) -> PackTiming | None:
    """The costs measured earlier for this shape on this machine, the pack's thread count put in the plan; else None."""
    timing = cache.get(_key(run), _timing)
    if timing is None:
        return None
    _keep_threads(run, timing.threads, "measured earlier in this process or its tune cache")
    return timing


def _timing(entry: dict[str, Any]) -> PackTiming:
    """A cached entry as costs, refused (ValueError) where it could not have been measured."""
    timing = validated(PackTiming, entry)
    if timing.k < 2 or timing.threads < 1 or min(timing.pack_step_s, timing.alone_step_s) <= 0:
        raise ValueError(f"k {timing.k}, threads {timing.threads}, steps {timing.pack_step_s} and {timing.alone_step_s} s")
    return timing


class StepProbe:
    """Times the pack's first training steps and one model alone between them; decides once the answer is clear."""

    def __init__(self, run: PackedVariants, cache: TuneCache, clock: Callable[[], float] = time.perf_counter):
        self.run, self.cache, self.clock = run, cache, clock
        self.counts = run.thread_candidates()
        tick = clock()
        self.alone, self.single = copy.deepcopy([run.models[0], run.optimizers[0]])  # variant 0 with its fit's optimizer
        self.alone.train()
        self.budget = MeasureBudget(run.k, run.total_steps, MIN_GAIN)
        self.budget.spent_s = clock() - tick  # what measuring costs the call: the copy and its steps (the pack's are training)
        self.pack_s: dict[int, list[float]] = {t: [] for t in self.counts}
        self.alone_s: dict[int, list[float]] = {t: [] for t in self.counts}
        self.first: tuple[float, float] | None = None
        self.phase = "first"
        """first (one-time costs), steady (pairs at the fastest count so far until clear), threads (one step at each
        other count, after the first steady one)."""
        self.count = self.counts[0]
        """The thread count steady pairs run at: the plan's, until another count's step was faster."""
        self.queue = [self.counts[0]]
        """The thread count of each step still to time."""
        self.steps = 0
        self.lost_s = 0.0
        """Pack steps counted as spent (slower per model than alone when timed)."""
        self.done = False
        self.choice: Choice[int] | None = None
        self.timing: PackTiming | None = None
        """What the measurement found, once done."""

    def timed(self, step: Callable[[], Any], batch: Any) -> Any:
        """Run the pack's `step` timed at the thread count its turn calls for, then one step of the model alone."""
        threads = self.queue.pop(0)
        set_threads(threads)
        values, pack_s = self._time(step, "pack")
        one = map_tensors(lambda leaf: leaf[0], batch)  # variant 0's rows of the pack's batch
        _, alone_s = self._time(lambda: self._alone_step(one), "alone")
        if self.phase == "first":  # and a second one right after: the budget's price of a step alone (decide.MeasureBudget)
            _, self.budget.warm_alone_s = self._time(lambda: self._alone_step(one), "alone")
            self.budget.spent_s += self.budget.warm_alone_s
        self.steps += 1
        self._record(threads, pack_s, alone_s)
        return values

    def _alone_step(self, batch: Any) -> None:
        self.run.loss_fn(self.alone, batch)["loss"].backward()
        self.single.step()
        self.single.zero_grad(set_to_none=True)

    def _time(self, step: Callable[[], Any], way: str) -> tuple[Any, float]:
        """`step`'s result and seconds; `way` ("pack" or "alone") names what is timed (a test's fake clock reads it)."""
        synchronize(self.run.device)
        tick = self.clock()
        out = step()
        synchronize(self.run.device)
        return out, self.clock() - tick

    def _record(self, threads: int, pack_s: float, alone_s: float) -> None:
        # Only the copy's steps are spent: the pack's steps are the training's own.
        if self.phase == "first":  # the pack's first step counts as spent: its one-time cost is overhead whichever way wins
            self.first, self.phase, self.queue = (pack_s, alone_s), "steady", [self.counts[0]]
            self.budget.spent_s += alone_s + pack_s
            self.lost_s += pack_s
            return
        self.pack_s[threads].append(pack_s)
        self.alone_s[threads].append(alone_s)
        # A pack slower per model than one model alone is likely thrown away: its steps count as spent then.
        lost = pack_s if pack_s > self.run.k * alone_s else 0.0
        self.lost_s += lost
        spent = alone_s + lost
        if self.phase == "threads":  # what this count's step took beyond the plan's count's steady one is spent on measuring
            spent += max(0.0, pack_s - statistics.median(self.pack_s[self.counts[0]]))
        self.budget.add(pack_s, alone_s, spent)
        if self.phase == "steady" and not all(self.pack_s[t] for t in self.counts[1:]):
            # One step at each other count right after the first steady one, before any more are spent at the plan's
            # count: on a machine whose other processes hold the cores, every-core steps stall at each operator's
            # barrier (10x slower here) and one thread is the fast way; on a quiet one a step at fewer cores costs at
            # most one pack step more.
            self.phase, self.queue = "threads", list(self.counts[1:])
            return
        if self.queue:
            return
        self.count = _fastest({t: statistics.median(v) for t, v in self.pack_s.items() if v}, self.counts[0])
        self.phase = "steady"
        if self.budget.done():
            self._decide()
        else:
            self.queue = [self.count]

    def _decide(self) -> None:
        run = self.run
        tried = [t for t in self.counts if self.pack_s[t]]
        pack_threads = _fastest({t: statistics.median(self.pack_s[t]) for t in tried}, self.counts[0])
        alone_threads = _fastest({t: statistics.median(self.alone_s[t]) for t in tried}, self.counts[0])
        pack_step_s, alone_step_s = statistics.median(self.pack_s[pack_threads]), statistics.median(self.alone_s[alone_threads])
        assert self.first is not None
        timing = PackTiming(k=run.k, pack_step_s=pack_step_s, alone_step_s=alone_step_s,
                            pack_once_s=run.build_s + max(0.0, self.first[0] - pack_step_s),
                            alone_once_s=max(0.0, self.first[1] - alone_step_s), threads=pack_threads, pairs=len(self.budget.pack))
        self.cache.put(_key(run), timing.to_dict())
        self.timing = timing
        if len(tried) > 1:
            versus = ", ".join(f"{t}: {statistics.median(self.pack_s[t]) * 1e3:.3g} ms" for t in tried)
            _keep_threads(run, pack_threads, f"the pack's step measured at {versus}")
        set_threads(run.plan.threads.value)
        self.done = True
        chosen, why = decide(timing, run.total_steps, pack_built=True, min_gain=MIN_GAIN)
        if not chosen:  # the pack's steps so far are lost with the copy's: what the measuring cost
            pack_steps = sum(sum(v) for v in self.pack_s.values()) + self.first[0]
            raise PackSlower(why, self.budget.spent_s + pack_steps - self.lost_s)  # the lost ones are in spent_s already
        self.choice = Choice(run.k, f"{why} ({run.form}; measured on its first {self.steps} training steps)")


def _key(run: PackedVariants) -> str:
    return shape_key("pack-variants", run.models[0], run.sample_signature, run.hardware.name, k=run.k, batch=run.batch,
                     optimizer=type(run.optimizers[0]).__name__, loss=getattr(run.loss_fn, "name", "fn"), threads=run.cfg.threads,
                     torch=torch.__version__)


def _keep_threads(run: PackedVariants, threads: int, why: str) -> None:
    if run.device.type == "cpu" and run.cfg.threads == "auto":
        run.plan = run.plan.replace(threads=Choice(threads, f"{threads}: {why}"))


def _fastest(seconds: dict[int, float], incumbent: int) -> int:
    """The fastest thread count; the incumbent unless another is at least MIN_GAIN faster (the probe's rule)."""
    best = min(seconds, key=seconds.__getitem__)
    return best if seconds[best] * MIN_GAIN <= seconds[incumbent] else incumbent
