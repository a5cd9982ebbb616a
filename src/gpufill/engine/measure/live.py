"""A CPU training's thread count and precision, chosen together on the training's own first steps.

Why on the training's own steps: the probe before training times each candidate on steps whose work is then thrown
away (the weights put back), so it may spend only a share of the training and a short one affords next to nothing (an
LSTM training of 176 steps at 6 ms had 0.11 s: one measurement). Here each arm's steps are steps of the training: the
only cost of measuring is the slower arms' extra time, so even a 2-second training can try every arm.

Why together: the fastest pair is not found one setting at a time. On a 2-core AMD EPYC with AVX512-bf16, an LSTM
(hidden 64, batch 128) ran 19.4k samples/s at 2 threads fp32, 13.3k at 1 thread fp32 and 15.2k at 2 threads bf16, so
threads-then-precision keeps 2 threads fp32; 1 thread bf16 ran 23.2k (bench/_fit_arm.py, one run each).

How, and what it costs: the planned arm runs the first 1 + BLOCK steps (the first pays first-call costs and is left
out). Each other arm then runs one warm-up step when its precision is new (oneDNN builds its bf16 kernels) and two
timed steps (the first after a switch of threads runs up to 1.5x slow): an arm whose faster one is DROP_SLOWER times
the best so far stops there, so a bad arm costs about three steps. The
others finish their block; the arms still in the race run a second block in reverse order; each arm's time is the
lower of its blocks' medians (a stall slows a block, nothing speeds one up). The planned arm is replaced only by one
MIN_GAIN faster. Before an arm with another precision first runs, the loss of the batch it will train on is computed
in eval mode at both precisions: beyond LOSS_TOLERANCE apart, the arm is dropped. The trial's steps are at most
TRIAL_SHARE of the training's, and it is skipped (and says so) when its plan does not fit.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import Hardware
from gpufill.engine.measure.cache import TuneCache
from gpufill.engine.measure.candidates import thread_counts
from gpufill.engine.measure.resolver import LOSS_TOLERANCE, MIN_GAIN
from gpufill.engine.plan import Plan

BLOCK = 3
"""Timed steps per arm and block."""
TRIAL_SHARE = 0.25
"""The trial's steps are at most this share of the training's."""
DROP_SLOWER = 1.25
"""An arm whose faster first two timed steps take this many times the best arm's time so far runs no further."""
COST_SHARE = 0.03
"""The trial ends, deciding between the arms timed so far, once the other arms' steps have cost this share of the
training's expected time (its steps at the planned arm's time) beyond what the planned arm would have taken; checked
where one arm's steps end, so it may pass by one arm's warm-up and two steps."""


@dataclass(frozen=True, slots=True)
class Arm:
    threads: int
    precision: str
    """"fp32" or "bf16"."""

    def __str__(self) -> str:
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} {self.precision}"

    def key(self) -> str:
        return f"{self.threads}/{self.precision}"


def arms_for(planned: Arm, thread_options: list[int], precisions: list[str]) -> list[Arm]:
    """Every pair, the planned arm first."""
    pairs = [Arm(planned.threads, p) for p in precisions] + [Arm(t, p) for t in thread_options for p in precisions]  # its threads first
    pairs = list(dict.fromkeys(pairs))
    return [planned, *(arm for arm in pairs if arm != planned)]


def steps_needed(arms: int, rounds: int) -> int:
    """The most steps a trial of `arms` takes: the planned arm's first and block, each other's warm-up and block, and
    the second round's blocks."""
    return 1 + BLOCK + (arms - 1) * (1 + BLOCK) + (rounds - 1) * arms * BLOCK


def rounds_that_fit(arms: int, total_steps: int | None) -> int:
    """2, 1, or 0 (no trial) rounds within TRIAL_SHARE of the training's steps."""
    if total_steps is None or arms < 2:
        return 0
    return next((rounds for rounds in (2, 1) if steps_needed(arms, rounds) <= TRIAL_SHARE * total_steps), 0)


@dataclass(slots=True)
class _Slot:
    arm: Arm
    warm: bool
    """The step is a warm-up (not timed)."""
    block: int
    """Which block it belongs to (0: first round)."""


@dataclass(slots=True)
class LiveTrial:
    """Drives the first steps of one training: `before_step()` says which arm the next step runs at (the caller applies
    it, and runs `check_precision` first when `needs_check` names the arm); `observe(seconds)` after it."""

    arms: list[Arm]
    rounds: int
    apply: Callable[[Arm], None]
    """Switches the training to an arm (threads, autocast dtype)."""
    total_steps: int
    """The training's optimizer steps (what COST_SHARE is a share of)."""
    times: dict[Arm, list[list[float]]] = field(default_factory=dict)
    """Each arm's timed steps, per block."""
    dropped: dict[Arm, str] = field(default_factory=dict)
    slots: list[_Slot] = field(default_factory=list)
    running: Arm | None = None
    warmed: set[str] = field(default_factory=set)
    """Precisions that have run a step."""
    queue_others: list[Arm] = field(default_factory=list)
    """The arms still to try in the first round."""
    checked: set[str] = field(default_factory=set)
    """Precisions whose loss was compared with the planned one's."""
    winner: Arm | None = None
    log: str = ""
    excess_s: float = 0.0
    """What the other arms' steps cost beyond the planned arm's time."""
    stopped: str = ""
    """Why the trial ended before every arm was tried (COST_SHARE)."""

    def __post_init__(self) -> None:
        self.slots = [_Slot(self.arms[0], True, 0), *(_Slot(self.arms[0], False, 0) for _ in range(BLOCK))]
        self.warmed.add(self.arms[0].precision)
        self.queue_others = list(self.arms[1:])

    @property
    def done(self) -> bool:
        return self.winner is not None

    def needs_check(self) -> Arm | None:
        """The arm the next step runs at, when its precision must first be checked against the planned one's."""
        self._refill()
        if self.done or not self.slots:
            return None
        arm = self.slots[0].arm
        return arm if arm.precision != self.arms[0].precision and arm.precision not in self.checked else None

    def precision_checked(self, precision: str, planned_loss: float, loss: float, *, error: str | None = None) -> None:
        """The loss of one batch at the planned precision and at `precision`, same weights, eval mode (`error`: the
        forward at `precision` raised; every arm of it is dropped with it)."""
        self.checked.add(precision)
        drift = abs(loss - planned_loss) / max(abs(planned_loss), 1e-12) if math.isfinite(loss) else math.inf
        if error is None and drift <= LOSS_TOLERANCE:
            return
        why = f"its forward failed ({error})" if error else f"its loss differs by {drift:.1%} from {self.arms[0].precision}'s (tolerance {LOSS_TOLERANCE:.0%})"
        for arm in self.arms:
            if arm.precision == precision:
                self._drop(arm, why)
        self.queue_others = [arm for arm in self.queue_others if arm.precision != precision]

    def before_step(self) -> None:
        """Switch to the arm the next step runs at."""
        self._refill()
        if self.done:
            return
        arm = self.slots[0].arm
        if arm != self.running:
            self.apply(arm)
            self.running = arm

    def observe(self, seconds: float) -> None:
        if self.done or not self.slots:
            return
        slot = self.slots.pop(0)
        self.warmed.add(slot.arm.precision)
        planned = self.arms[0]
        if not slot.warm:
            blocks = self.times.setdefault(slot.arm, [])
            while len(blocks) <= slot.block:
                blocks.append([])
            blocks[slot.block].append(seconds)
        if slot.arm == planned:
            self._refill()
            return
        self.excess_s += seconds - self._time(planned)
        first = self.times.get(slot.arm, [[]])[0]
        if not slot.warm and slot.block == 0 and len(first) == 2:
            best = min(self._time(arm) for arm in self.times if arm not in self.dropped and arm != slot.arm)
            if min(first) > DROP_SLOWER * best:
                self._drop(slot.arm, f"{min(first) * 1e3:.3g} ms on its first steps, over {DROP_SLOWER:g}x the best ({best * 1e3:.3g} ms)")
        # Checked where an arm's steps end, never between its warm-up and its timed steps: a slow warm-up (oneDNN
        # building bf16 kernels) must not end the trial before the arm it paid for is timed.
        at_boundary = not self.slots or self.slots[0].arm != slot.arm
        if at_boundary and self.excess_s > COST_SHARE * self.total_steps * self._time(planned):
            self.stopped = f"stopped after {self.excess_s:.2f} s of slower steps ({COST_SHARE:.0%} of the training's expected time)"
            self.slots, self.queue_others = [], []
            self._decide()
            return
        self._refill()

    # -- the schedule -----------------------------------------------------------------------
    def _drop(self, arm: Arm, why: str) -> None:
        self.dropped[arm] = why
        self.slots = [slot for slot in self.slots if slot.arm != arm]

    def _refill(self) -> None:
        """Queue the next arm's steps, the second round, or decide."""
        while not self.slots and not self.done:
            if self.queue_others:
                arm = self.queue_others.pop(0)
                if arm in self.dropped:
                    continue
                warm = [_Slot(arm, True, 0)] if arm.precision not in self.warmed else []
                self.slots = [*warm, *(_Slot(arm, False, 0) for _ in range(BLOCK))]
            elif self.rounds > 1 and not any(len(blocks) > 1 for blocks in self.times.values()):
                racing = [arm for arm in reversed(self.arms) if arm in self.times and arm not in self.dropped]
                best = min(self._time(arm) for arm in racing)
                slow = [arm for arm in racing if self._time(arm) > DROP_SLOWER * best]
                for arm in slow:
                    if arm != self.arms[0]:  # the planned arm stays the measure of the others, without a second block
                        self._drop(arm, f"{self._time(arm) * 1e3:.3g} ms per step, over {DROP_SLOWER:g}x the best")
                racing = [arm for arm in racing if arm not in slow]
                if len(racing) < 2:
                    self._decide()
                    return
                self.slots = [_Slot(arm, False, 1) for arm in racing for _ in range(BLOCK)]
            else:
                self._decide()

    def _time(self, arm: Arm) -> float:
        return min(statistics.median(block) for block in self.times[arm] if block)

    def _decide(self) -> None:
        planned = self.arms[0]
        # An arm needs two timed steps to win: one step alone may have been lucky.
        timed = {arm: self._time(arm) for arm in self.times
                 if arm == planned or (arm not in self.dropped and sum(len(block) for block in self.times[arm]) >= 2)}
        best = min(timed, key=timed.__getitem__)
        self.winner = best if timed[best] * MIN_GAIN <= timed[planned] else planned
        if self.winner != self.running:
            self.apply(self.winner)
            self.running = self.winner
        shown = ", ".join(f"{arm} {timed[planned] / seconds:.2f}x" for arm, seconds in timed.items() if arm != planned)
        dropped = "; ".join(f"{arm} dropped: {why}" for arm, why in self.dropped.items())
        verdict = (f"{self.winner} kept" if self.winner == planned else f"{self.winner}, {timed[planned] / timed[self.winner]:.2f}x {planned}")
        untried = [str(arm) for arm in self.arms if arm not in self.times]
        stopped = f"; {self.stopped}, {', '.join(untried)} not tried" if self.stopped and untried else f"; {self.stopped}" if self.stopped else ""
        self.log = (f"{verdict}: measured on the training's first steps ({planned} {timed[planned] * 1e3:.3g} ms per step"
                    f"{'; vs it: ' + shown if shown else ''}{'; ' + dropped if dropped else ''}{stopped})")

    def record(self) -> dict[str, Any]:
        """What the tune cache keeps: the winner and each arm's time."""
        assert self.winner is not None
        return {"winner": self.winner.key(), "log": self.log,
                "seconds": {arm.key(): self._time(arm) for arm in self.times if any(self.times[arm])}}


def arm_of(key: str) -> Arm | None:
    """The arm a cache entry names (None: an entry of another shape)."""
    threads, _, precision = str(key).partition("/")
    return Arm(int(threads), precision) if threads.isdigit() and precision in ("fp32", "bf16") else None


def choices(plan: Plan, winner: Arm, reason: str) -> Plan:
    """`plan` with the winner's threads and precision, each with `reason`."""
    return plan.replace(threads=Choice(winner.threads, f"{winner.threads}: {reason}"),
                        precision=Choice(winner.precision, f"{winner.precision}: {reason}"))


def start(plan: Plan, cfg: FitConfig, hardware: Hardware, *, total_steps: int | None, cache: TuneCache, key: str,
          apply: Callable[[Arm], None]) -> tuple[Plan, LiveTrial | None]:
    """The plan and the trial for a CPU training whose threads or precision are left to gpufill (`applies`): a cached
    winner of this shape is applied at once and nothing is tried; too short a training keeps the plan and says why."""
    planned = Arm(plan.threads.value, plan.precision.value)
    cached = cache.get(key, _cached_winner)
    if cached is not None:
        winner, log = cached
        apply(winner)
        return choices(plan, winner, f"cached from an earlier training of this shape on this machine ({log})"), None
    thread_options = thread_counts(planned.threads, hardware.cpu_count) if cfg.threads == "auto" else [planned.threads]
    timed = cfg.precision == "auto" and cfg.timed_precision and hardware.bf16_supported
    precisions = ["fp32", "bf16"] if timed and not plan.compile.value else [planned.precision]
    arms = arms_for(planned, thread_options, precisions)
    if len(arms) < 2:
        return plan, None  # one core, fp32 only: nothing to choose between
    rounds = rounds_that_fit(len(arms), total_steps)
    if rounds == 0:
        why = (f"not measured: trying {len(arms)} settings takes {steps_needed(len(arms), 1)} steps, over {TRIAL_SHARE:.0%} of "
               f"this training's {total_steps}")
        return plan.replace(threads=Choice(planned.threads, f"{plan.threads.reason}; {why}"),
                            precision=Choice(planned.precision, f"{plan.precision.reason}; {why}")), None
    return plan, LiveTrial(arms, rounds, apply, total_steps or 0)


def _cached_winner(entry: dict[str, Any]) -> tuple[Arm, str]:
    """A cached trial's winner and what it measured; ValueError where the winner is not an arm of this machine's kind."""
    winner = arm_of(entry["winner"]) if isinstance(entry.get("winner"), str) else None
    if winner is None or winner.threads < 1 or winner.threads > (os.cpu_count() or 1):
        raise ValueError(f"winner {entry.get('winner')!r} is not threads/precision on this machine")
    return winner, str(entry.get("log", ""))


def applies(cfg: FitConfig, hardware: Hardware, distributed: bool) -> bool:
    """A CPU training (not under DDP, whose ranks share the cores by design) with threads, or precision on a CPU with
    bf16 instructions, left to gpufill and measuring allowed: its first steps choose them, not the probe."""
    if hardware.device_type != "cpu" or distributed or cfg.probe is False:
        return False
    return cfg.threads == "auto" or (cfg.precision == "auto" and cfg.timed_precision and hardware.bf16_supported)
