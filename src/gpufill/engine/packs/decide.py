"""Whether K variants train as one pack: measured costs, charged as the run will pay them.

A pack's first steps cost more than its later ones (vmap's first trace, the allocator, the optimizer's state), and
so does one model's. Timing a few steps and extrapolating charges that one-time cost on every step and refuses the
pack exactly where it pays (a pack 1.8x faster per step measured at 0.86x). Here the first step of each way is timed
apart from its steady steps, and the decision charges each way what the training would pay: the one-time cost once
(per model when one at a time: each fit starts fresh), the steady step for every planned step. `decide` is plain
arithmetic on a `PackTiming`, so it is tested on made-up numbers; `MeasureBudget` stops the measuring once the
answer is clear or the budget (a share of the planned training) is spent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufill.engine.measure.cache import ENTRY_CONFIG

GOAL_SHARE = 0.05
"""What deciding may cost of the whole call."""
BUDGET_SHARE = 0.04
"""The steady pairs may cost this share of the training they decide (one at a time, as planned): below GOAL_SHARE,
because what the budget cannot see (copying a model, building the pack, the first pair's cold steps, which every
answer needs) lands on top of it. On a fast CPU, where a 4-variant call of a million-parameter model takes 4.5 s, a
5 % budget measured 5.3 % of the call."""
MIN_PAIRS = 2
"""Steady steps of each way before an answer counts as clear (a clearly slower pack stops after one)."""
MAX_PAIRS = 8
"""No more steady steps of each way, clear or not."""
CLEAR_MARGIN = 1.3
"""Clear: every pair so far puts one way ahead of the other by at least this much."""
MIN_MEASURED_STEPS = math.ceil(2 / GOAL_SHARE)
"""The least a measurement takes is two pack steps (its first and a steady one), thrown away if the pack loses: a
training of fewer planned steps per model than this trains one at a time unmeasured (pack=True packs it)."""


@dataclass(frozen=True)
class PackTiming:
    """What a pack of `k` and one model alone cost, measured on this machine (seconds)."""

    __pydantic_config__ = ENTRY_CONFIG  # read back from a tune cache (engine/measure/cache.py `validated`)

    k: int
    pack_step_s: float
    """A steady step of the whole pack."""
    alone_step_s: float
    """A steady step of one model alone."""
    pack_once_s: float
    """Building the pack and its first step beyond a steady one."""
    alone_once_s: float
    """One model's first step beyond a steady one: paid once per variant when they train one at a time."""
    threads: int
    """The pack's thread count (its fastest measured)."""
    pairs: int = 0
    """How many steady steps of each way the numbers are medians of."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(timing: PackTiming, steps: int, *, pack_built: bool, min_gain: float) -> tuple[bool, str]:
    """(pack?, the reason) for `steps` optimizer steps per model. `pack_built`: the pack was built and stepped
    while measuring (training reuses it), so its one-time cost is spent either way and not charged again."""
    k = timing.k
    per_model = timing.pack_step_s / k
    pack_s = (0.0 if pack_built else timing.pack_once_s) + steps * timing.pack_step_s
    alone_s = k * (timing.alone_once_s + steps * timing.alone_step_s)
    ratio = timing.alone_step_s / per_model if per_model > 0 else math.inf
    steady = f"{per_model * 1e3:.3g} ms per model-step vs {timing.alone_step_s * 1e3:.3g} ms alone after warm-up ({ratio:.2f}x)"
    saving = timing.alone_step_s * k - timing.pack_step_s  # seconds a pack step saves over K steps alone
    once = timing.pack_once_s - k * timing.alone_once_s
    if saving > 0:
        back = max(0, math.ceil(once / saving)) if once > 0 else 0
        payback = f"{timing.pack_once_s:.3g} s one-time, paid back after {back} of its {steps} steps"
    else:
        payback = f"{timing.pack_once_s:.3g} s one-time, never paid back"
    threads = f" at {timing.threads} thread{'s' if timing.threads > 1 else ''}"
    if pack_s * min_gain <= alone_s:
        return True, f"one pack of {k}{threads}: {steady}; {payback}"
    return False, f"a pack of {k}{threads} would be slower in all: {steady}; {payback}"


@dataclass
class MeasureBudget:
    """When to stop timing steady steps: the answer is clear, or the budget is spent, or MAX_PAIRS were taken."""

    k: int
    steps: int
    """Planned optimizer steps per model."""
    min_gain: float
    """The gain a pack needs (`decide`'s): pairs that never show it stop the measuring."""
    pack: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    spent_s: float = 0.0
    warm_alone_s: float = math.inf
    """One model's step timed right after another of its own (warm caches): what a step costs when the variants
    train one at a time. The paired steps run between pack steps, which evict the model from the caches: 2-4x
    slower on a CPU, and a budget priced on them alone grants 2-4x the share (6.4 % of a call measured on a loaded
    box, against the 4 % meant)."""

    def add(self, pack_s: float, alone_s: float, spent_s: float) -> None:
        """One steady pair: each way's step time, and the time the pair took (added to `spent_s`)."""
        self.pack.append(pack_s)
        self.alone.append(alone_s)
        self.spent_s += spent_s

    @property
    def budget_s(self) -> float:
        """BUDGET_SHARE of the training as the faster way would run it (K models alone, or the pack), priced at the
        fastest steady steps so far: a share of the call the user waits for, whichever way it goes. The fastest, not
        the median: a step timed between the other way's steps runs with a cold cache, and a loaded machine only
        slows steps, so the median would grant a budget the real training does not last for."""
        if not self.alone:
            return 0.0
        alone = self.k * min(*self.alone, self.warm_alone_s)
        return BUDGET_SHARE * self.steps * min(alone, min(self.pack)) if self.pack else BUDGET_SHARE * self.steps * alone

    def done(self) -> bool:
        pairs = len(self.pack)
        if pairs >= MAX_PAIRS:
            return True
        if pairs and self.spent_s + self.spent_s / (pairs + 1) > self.budget_s:  # another pair (about the mean so far) would overrun it
            return True
        ratios = [a * self.k / p for p, a in zip(self.pack, self.alone, strict=True) if p > 0]
        if not ratios:
            return False
        if max(ratios) <= 1 / CLEAR_MARGIN:
            return True  # a pack clearly slower: one pair is enough (its steps are thrown away, so no lingering)
        if pairs >= MIN_PAIRS and max(ratios) < self.min_gain:
            return True  # no pair shows the gain a pack needs (`decide`'s min_gain): each further pair is likely thrown away too
        return pairs >= MIN_PAIRS and min(ratios) >= CLEAR_MARGIN  # a faster pack's steps are training: 2+ pairs
