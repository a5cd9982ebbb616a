"""The measured plan: time each stage's candidates on real steps and keep the fastest that keeps
the numerics, in one pass before the first epoch, within a bounded budget.

What "fastest" means here: the minimum over interleaved rounds of each candidate's seconds per
optimizer step (noise only ever slows a step; within a CPU measurement, the median step, so one stalled
step sizes neither the budget nor a choice), and a candidate replaces the
current value only when at least MIN_GAIN faster, so the plain setting wins every tie.
What "keeps the numerics" means: the losses of its first CHECK_STEPS steps, from the same
weights on the same batches, within LOSS_TOLERANCE of the reference's (the plan as it started:
fp32 unless another precision was requested).

The budget: PROBE_SHARE of the training's expected time (its optimizer steps at the plain plan's step: a median
per CPU measurement, and the fastest of its measurements, the reference's and the first stage's, so a stalled
start never inflates it), at
most PROBE_MAX_S, plus COMPILE_MAX_S where a compile is a candidate. Every measurement after the reference runs
under a deadline (deadline.py): one still running at OVERRUN times the budget (a compile far slower than assumed, a
step stalled by other work) is abandoned and dropped with that reason. The blocks are sized to it: two interleaved rounds of
BLOCK_S for fast steps where every stage ahead fits, else one round of shorter blocks, so a short
training measures all its stages rather than the first ones well. A candidate whose estimated cost
(from the current plan's measured step) would still pass it is not measured, and the plan says so. A whole resolve is cached per model shape and device
(`TuneCache`): the next training of that shape measures nothing.

The probe (`Probe.measure`) does the real work on the real model and puts everything back;
the fake probes of the tests drive this logic with chosen timings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gpufill.engine.choice import Choice
from gpufill.engine.config import SpeedSettings
from gpufill.engine.hardware import Hardware
from gpufill.engine.measure.batch import BatchTrial, search_batch
from gpufill.engine.measure.cache import ENTRY_CONFIG, TuneCache, validated
from gpufill.engine.measure.deadline import Abandoned
from gpufill.engine.measure.candidates import Context, Stage, blocked, stages, variant
from gpufill.engine.plan import DataFacts, Plan, lr_reference_batch, lr_scale_factor

PROBE_SHARE = 0.10
"""The probe may spend this share of the training's expected time."""
PROBE_MAX_S = 30.0
"""...and never more than this many seconds on its cheap stages (threads, precision, kernels, graphs)."""
COMPILE_MAX_S = 120.0
"""What a compile candidate may add (its first call traces and compiles; a kept compile's code is what the
training then runs): the stated budget with a compile stage is the share, at most PROBE_MAX_S + this."""
OVERRUN = 1.25
"""A measurement still running at this multiple of the stated budget is abandoned."""
PROBE_MIN_STEPS = 100
"""Below this many optimizer steps nothing is measured: the first measurement alone takes about 6 steps,
more than PROBE_SHARE of such a training."""
MIN_GAIN = 1.03
"""A candidate replaces the current value only when its step is at least this much faster."""
LOSS_TOLERANCE = 0.02
"""A candidate whose first losses differ from the reference's by more than this share is dropped."""
CHECK_STEPS = 3
"""Losses compared per candidate: the first is the same weights' forward, the others follow its updates."""
BLOCK_S = 0.05
"""Timed steps per measurement: enough to last this long (timer and scheduler noise), within TIMED_STEPS."""
TIMED_STEPS = (3, 40)
TWO_ROUNDS_BELOW_S = 0.02
"""Steps faster than this are measured in two interleaved rounds (cheap, and noisier)."""
COMPILE_GUESS_S = {"cuda": 30.0, "cpu": 20.0}
"""What one torch.compile is assumed to cost before it has been measured on this machine."""
BATCH_SEARCH_STEPS = 8
"""Timed steps per batch size the search tries."""
MICRO_RANGE = 16
"""The batch search's smallest micro-batch is the effective batch / this (e.g. 128 -> 8)."""
MIN_STEPS_PER_EPOCH = 4
"""With tune_effective_batch: keep at least this many optimizer steps per epoch."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One candidate's timed steps, or why it could not run."""

    __pydantic_config__ = ENTRY_CONFIG  # read back from a tune cache: engine/measure/cache.py

    step_s: float | None
    """Seconds per optimizer step (None: the candidate failed)."""
    losses: tuple[float, ...] = ()
    """The losses of its first CHECK_STEPS steps (empty when not checked)."""
    setup_s: float = 0.0
    """Building it: the optimizer, a CUDA graph capture, a compile's first call."""
    cost_s: float = 0.0
    """Wall time of the whole measurement."""
    error: str | None = None
    peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Probe(Protocol):
    def measure(self, plan: Plan, *, timed_steps: int, check: bool, limit: float | None = None) -> Measurement:
        """Run the training's step as `plan` says: CHECK_STEPS checked steps (losses read) when
        `check`, else one warm-up step, then `timed_steps` timed ones; everything put back after. `limit`: seconds
        after which the steps are abandoned (`deadline`, armed inside what puts everything back), raising `Abandoned`."""
        ...

    def release(self) -> None:
        """Forget what was built for earlier candidates (their optimizer state, graphs, compiled code)."""
        ...


def label(plan: Plan) -> str:
    """The measured settings of a plan variant: what tells two measurements apart."""
    return (f"threads={plan.threads.value} precision={plan.precision.value} tf32={plan.tf32.value} "
            f"cudnn_benchmark={plan.cudnn_benchmark.value} kernel={plan.optimizer_kernel.value} graph={plan.step_graph.value} "
            f"compile={plan.compile.value} micro={plan.micro_batch.value}")


@dataclass(slots=True)
class _Ledger:
    """What the probe has spent and measured so far."""

    clock: Callable[[], float]
    started: float
    budget_s: float = math.inf
    """The stated budget: what the probe as a whole may spend (a compile included)."""
    cheap_s: float = math.inf
    """What the cheap stages may spend: the share, at most PROBE_MAX_S."""
    measured: dict[str, Measurement] = field(default_factory=dict)
    count: int = 0
    excluded_s: float = 0.0
    """Time the training pays anyway (building its first kit: torch.optim's lazy imports), not the probe's."""

    def spent(self) -> float:
        return self.clock() - self.started - self.excluded_s


def resolve(plan: Plan, probe: Probe, *, settings: SpeedSettings, hardware: Hardware, facts: DataFacts, context: Context,
            total_steps: int | None, cache: TuneCache, key: str, events: list[str], clock: Callable[[], float] = time.perf_counter) -> Plan:
    """The finished plan: every auto setting measured (or said why not), the probe's cost in `plan.probe`.
    A planned batch search runs whatever the probe's budget (it was planned for the training's length)."""
    why_not = None
    if settings.probe is False:
        why_not = plan.probe.reason
    elif total_steps is None:
        why_not = "off: the training's length is unknown, so no budget can be set"
    elif settings.probe == "auto" and total_steps < PROBE_MIN_STEPS:
        why_not = f"off: only {total_steps} optimizer steps; measuring costs more than it could save (needs {PROBE_MIN_STEPS}+)"
    elif not stages(plan, settings, hardware, context):
        why_not = "nothing to measure: every setting that could be was requested or cannot apply here"
    if why_not is not None and not plan.batch_search.value:
        return _unmeasured(plan, why_not)
    cached = cache.get(key, lambda entry: validated(dict[str, Measurement], entry["measured"]))
    ledger = _Ledger(clock=clock, started=clock())
    if cached is not None:
        ledger.measured = dict(cached)
    resolver = _Resolver(plan, probe, settings, hardware, facts, context, total_steps or 0, ledger, cached is not None)
    finished = resolver.run(events, why_not)
    if cached is None and ledger.measured:
        cache.put(key, {"measured": {name: m.to_dict() for name, m in ledger.measured.items()}})
    return finished


class _Resolver:
    def __init__(self, plan: Plan, probe: Probe, settings: SpeedSettings, hardware: Hardware, facts: DataFacts, context: Context,
                 total_steps: int, ledger: _Ledger, from_cache: bool):
        self.plan, self.probe, self.settings, self.hardware, self.context = plan, probe, settings, hardware, context
        self.facts = facts
        self.total_steps, self.ledger, self.from_cache = total_steps, ledger, from_cache
        self.note = " (cached measurement)" if from_cache else ""
        self.timed_steps, self.rounds = TIMED_STEPS[0], 1
        self.reference: Measurement | None = None
        self.fastest_s = math.inf
        """The plain plan's fastest step measured: the training's expected time is its steps at this."""
        self.compiles = False
        self.plain = ""
        """The plain plan's label (after a batch search): its measurements set the expected training time."""
        self.guess_step_s: float | None = None
        """The step time a candidate's cost is estimated from: the current plan's, measured."""

    def run(self, events: list[str], why_not: str | None) -> Plan:
        plan = self.plan
        if plan.batch_search.value:
            self.timed_steps = BATCH_SEARCH_STEPS
            plan = self._search_batch(plan, events)
        if why_not is not None:
            return _unmeasured(plan, why_not)
        planned = stages(plan, self.settings, self.hardware, self.context)  # the plan the batch search left: measured as is below
        self.compiles = any(stage.costly for stage in planned)
        self.plain = label(plan)
        reference = self._measure(plan, check=True)
        if reference.step_s is None:
            why = f"off: the plain step failed while measuring ({reference.error}); the training reports it"
            return _unmeasured(plan, why)
        self.reference = reference
        self.ledger.excluded_s = reference.setup_s
        self.timed_steps, self.rounds = _block_sizes(reference, planned, self.ledger.cheap_s - self.ledger.spent())
        for stage in planned:
            plan = self._stage(plan, stage, events)
        spent = 0.0 if self.from_cache else self.ledger.spent()
        cap = f"{PROBE_MAX_S + COMPILE_MAX_S:g} s with a compile" if self.compiles else f"{PROBE_MAX_S:g} s"
        how = (f"{self.ledger.count} measurements in {spent:.2f} s (budget {self.ledger.budget_s:.2f} s: {PROBE_SHARE:.0%} of the "
               f"expected {self.total_steps * self.fastest_s:.1f} s of training, at most {cap})")
        if self.from_cache:
            how = f"cached measurements of this model shape on this device (measured before: budget {self.ledger.budget_s:.2f} s)"
        events.append(f"probe: {how}")
        return plan.replace(probe=Choice(round(spent, 4), how))

    # -- one stage --------------------------------------------------------------------------
    def _stage(self, plan: Plan, stage: Stage, events: list[str]) -> Plan:
        current = getattr(plan, stage.setting)
        # A candidate's cost is guessed from the plan as the earlier stages left it (2 threads, say, not the reference's 1).
        known = self.ledger.measured.get(label(plan))
        self.guess_step_s = known.step_s if known is not None and known.step_s is not None else self.reference.step_s if self.reference else None
        why_not = blocked(stage, plan, self.hardware, self.context)
        if why_not is not None:
            return plan.replace(**{stage.setting: Choice(current.value, f"{current.reason}; not measured: {why_not}")})
        variants = [variant(plan, stage.setting, value, "measuring") for value in stage.candidates]
        results: list[list[Measurement]] = [[] for _ in variants]
        skipped: dict[int, str] = {}
        for round_index in range(self.rounds):
            for i, candidate in enumerate(variants):
                if i in skipped or (results[i] and results[i][-1].step_s is None):
                    continue
                why = self._unaffordable(candidate, stage, first=not results[i])
                if why is not None:
                    skipped[i] = why
                    continue
                # Only a challenger's losses are compared (with the reference's); the current value's are known.
                check = round_index == 0 and i > 0 and not self._losses(candidate)
                results[i].append(self._measure(candidate, check=check))
        self.probe.release()
        return self._decide(plan, stage, list(stage.candidates), variants, results, skipped, events)

    def _losses(self, candidate: Plan) -> tuple[float, ...]:
        known = self.ledger.measured.get(label(candidate))
        return known.losses if known is not None else ()

    def _unaffordable(self, candidate: Plan, stage: Stage, *, first: bool) -> str | None:
        if self.from_cache:
            return None if label(candidate) in self.ledger.measured else "not measured when this shape was probed"
        assert self.guess_step_s is not None
        steps = (CHECK_STEPS if first else 1) + self.timed_steps
        estimate = steps * self.guess_step_s
        if stage.costly and first:
            estimate += COMPILE_GUESS_S.get(self.hardware.device_type, COMPILE_GUESS_S["cuda"])
        left = (self.ledger.budget_s if stage.costly else self.ledger.cheap_s) - self.ledger.spent()
        if estimate > left:
            return f"not measured: about {estimate:.1f} s, and {max(left, 0):.1f} s of the probe's budget is left"
        return None

    def _decide(self, plan: Plan, stage: Stage, values: list[Any], variants: list[Plan], results: list[list[Measurement]],
                skipped: dict[int, str], events: list[str]) -> Plan:
        assert self.reference is not None
        # Each candidate's fastest step over every stage that timed it (the ledger's): a fresh probe and
        # its cached replay then decide from the very same numbers.
        timed = [self._fastest(v, r) for v, r in zip(variants, results, strict=True)]
        notes: list[str] = []
        best = 0
        incumbent = timed[0]
        if incumbent is None or incumbent.step_s is None:
            # The current value could not be measured (budget): nothing to compare against.
            current = getattr(plan, stage.setting)
            reason = skipped.get(0, incumbent.error if incumbent is not None else "not measured")
            return plan.replace(**{stage.setting: Choice(current.value, f"{current.reason}; {reason}")})
        for i in range(1, len(values)):
            name = _show(stage.setting, values[i])
            m = timed[i]
            if i in skipped:
                notes.append(f"{name} {skipped[i]}")
                continue
            if m is None or m.step_s is None:
                notes.append(f"{name} dropped ({m.error if m is not None else 'not measured'})")
                continue
            speed = incumbent.step_s / m.step_s
            drift = _loss_drift(self.reference, self._losses(variants[i]))
            if drift is not None and drift > LOSS_TOLERANCE:
                notes.append(f"{name} {speed:.2f}x but dropped: its loss differs by {drift:.1%} from the reference's (tolerance {LOSS_TOLERANCE:.0%})")
                continue
            notes.append(f"{name} {speed:.2f}x")
            best_m = timed[best]
            assert best_m is not None and best_m.step_s is not None
            if m.step_s * MIN_GAIN <= best_m.step_s:
                best = i
        winner = values[best]
        winner_m = timed[best]
        assert winner_m is not None and winner_m.step_s is not None
        base = _show(stage.setting, values[0])
        ms = f"{winner_m.step_s * 1e3:.3g} ms per step"
        if best == 0:
            reason = f"{base} kept: measured {ms}; vs it: {', '.join(notes)}{self.note}"
        else:
            reason = (f"measured {incumbent.step_s / winner_m.step_s:.2f}x {base} on this device for this model ({ms}); "
                      f"vs {base}: {', '.join(notes)}{self.note}")
        if winner_m.setup_s >= 1.0:
            reason += f"; building it took {winner_m.setup_s:.1f} s"
        events.append(f"{stage.setting}: {reason}")
        return variant(plan, stage.setting, winner, reason)

    def _fastest(self, candidate: Plan, runs: list[Measurement]) -> Measurement | None:
        fastest = _fastest(runs)
        if fastest is None or fastest.step_s is None:
            return fastest
        return self.ledger.measured.get(label(candidate), fastest)

    # -- the batch search -------------------------------------------------------------------
    def _search_batch(self, plan: Plan, events: list[str]) -> Plan:
        """The fastest micro-batch (or, with tune_effective_batch, effective batch) within the memory margin."""
        scope_effective = self.settings.tune_effective_batch
        effective = plan.effective_batch.value
        if scope_effective:
            limit = max(effective, _power_of_two_at_most((self.facts.n_train or effective) // MIN_STEPS_PER_EPOCH))
            start = max(1, effective // 4)
        else:
            limit = min(effective, self.facts.loader_batch or effective)
            start = max(1, limit // MICRO_RANGE)
        budget = int(self.hardware.total_memory_bytes * self.settings.memory_margin) if self.hardware.is_cuda else None

        def trial(size: int) -> BatchTrial:
            whole = size if scope_effective else effective
            candidate = plan.replace(effective_batch=Choice(whole, "measuring"), micro_batch=Choice(size, "measuring"),
                                     accumulation=Choice(-(-whole // size), "measuring"))
            m = self._measure(candidate, check=False)
            self.probe.release()
            if m.step_s is None:
                return BatchTrial(size=size, samples_per_s=None)
            return BatchTrial(size=size, samples_per_s=min(whole, self.facts.n_train or whole) / m.step_s, peak_bytes=m.peak_bytes)

        result = search_batch(trial, start=start, limit=limit, budget_bytes=budget)
        size = result.best.size
        where = f"within {self.settings.memory_margin:.0%} of device memory" if budget else "no device memory limit on CPU"
        detail = f"fastest {'cached measurement' if self.from_cache else 'measured'} ({where}; {result.summary()})"
        events.append(f"batch search: {detail} -> {size}")
        if scope_effective:
            reference = lr_reference_batch(self.settings)
            factor = lr_scale_factor(size, reference, self.settings.lr_scale_rule)
            return plan.replace(
                effective_batch=Choice(size, f"{size}: {detail}; allowed by tune_effective_batch"),
                micro_batch=Choice(size, "the whole effective batch per step"),
                accumulation=Choice(1, "1: the micro-batch is the whole effective batch"),
                lr_scale=Choice(factor, f"{self.settings.lr_scale_rule} rule: effective batch {size} / reference {reference} -> lr x {factor:.3g}"),
            )
        accumulation = -(-effective // size)
        return plan.replace(
            micro_batch=Choice(size, f"{size}: {detail}"),
            accumulation=Choice(accumulation, f"{accumulation} micro-batches of {size} keep the effective batch {effective}"),
        )

    # -- measuring ----------------------------------------------------------------------------
    def _measure(self, candidate: Plan, *, check: bool) -> Measurement:
        """A fresh measurement (or, from the cache, the stored one); the ledger keeps each label's
        fastest step and its first checked losses."""
        name = label(candidate)
        known = self.ledger.measured.get(name)
        if self.from_cache:
            found = known if known is not None else Measurement(None, error="not measured when this shape was probed")
            self._timed(candidate, found)
            return found
        m = self._within_deadline(candidate, check)
        self.ledger.count += 1
        self._timed(candidate, m)
        if known is None or known.step_s is None or m.step_s is None:
            self.ledger.measured[name] = m if known is None or m.step_s is None else known
        else:
            self.ledger.measured[name] = Measurement(min(known.step_s, m.step_s), known.losses or m.losses, max(known.setup_s, m.setup_s),
                                                     known.cost_s + m.cost_s, None, m.peak_bytes)
        return m


    def _within_deadline(self, candidate: Plan, check: bool) -> Measurement:
        """The probe's measurement, abandoned at OVERRUN times the budget (the reference, which sets it, runs whole)."""
        limit = None if self.reference is None else max(OVERRUN * self.ledger.budget_s - self.ledger.spent(), 0.0)
        started = self.ledger.clock()
        try:
            return self.probe.measure(candidate, timed_steps=self.timed_steps, check=check, limit=limit)
        except Abandoned:
            self.probe.release()  # a half-built kit (a compile cut off mid-trace) is never measured again
            took = self.ledger.clock() - started
            return Measurement(None, cost_s=took, error=f"abandoned after {took:.1f} s, past {OVERRUN:g}x the probe's budget of {self.ledger.budget_s:.1f} s")

    def _timed(self, candidate: Plan, m: Measurement) -> None:
        """A faster step of the plain plan than before lowers the training's expected time, and the budget with it."""
        if m.step_s is None or m.step_s >= self.fastest_s or label(candidate) != self.plain:
            return
        self.fastest_s = m.step_s
        share = PROBE_SHARE * self.total_steps * m.step_s
        self.ledger.cheap_s = min(share, PROBE_MAX_S)
        self.ledger.budget_s = min(share, PROBE_MAX_S + (COMPILE_MAX_S if self.compiles else 0.0))


def _block_sizes(reference: Measurement, planned: list[Stage], budget_s: float) -> tuple[int, int]:
    """Timed steps per measurement and interleaved rounds for the stages ahead: blocks of BLOCK_S and,
    for fast steps, two rounds; both shrunk (to one round, then down to TIMED_STEPS[0] steps) until every
    cheap stage's measurements fit `budget_s`, so a short training's budget is spread over all its
    stages instead of being spent on the first ones."""
    assert reference.step_s is not None
    step_s = max(reference.step_s, 1e-9)
    timed = min(max(math.ceil(BLOCK_S / step_s), TIMED_STEPS[0]), TIMED_STEPS[1])
    rounds = 2 if step_s < TWO_ROUNDS_BELOW_S else 1
    cheap = [stage for stage in planned if not stage.costly]
    measurements = sum(len(stage.candidates) for stage in cheap)
    first_checks = sum(len(stage.candidates) - 1 for stage in cheap) * (CHECK_STEPS - 1)
    # What a measurement costs beside its steps (building the kit, putting the weights back), from the reference's.
    overhead = max(0.0, reference.cost_s - reference.setup_s - (CHECK_STEPS + TIMED_STEPS[0]) * step_s)

    def cost(timed: int, rounds: int) -> float:
        return (rounds * measurements * (1 + timed) + first_checks) * step_s + rounds * measurements * overhead

    while rounds > 1 and cost(timed, rounds) > budget_s:
        rounds -= 1
    while timed > TIMED_STEPS[0] and cost(timed, rounds) > budget_s:
        timed = max(TIMED_STEPS[0], timed * 3 // 4)
    return timed, rounds


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _fastest(runs: list[Measurement]) -> Measurement | None:
    ok = [m for m in runs if m.step_s is not None]
    if not ok:
        return runs[-1] if runs else None
    return min(ok, key=lambda m: m.step_s)  # type: ignore[arg-type, return-value]


def _loss_drift(reference: Measurement, losses: tuple[float, ...]) -> float | None:
    """|mean loss - reference's| / |reference's| over the checked steps; inf for a non-finite loss."""
    if not reference.losses or not losses:
        return None
    if not all(math.isfinite(v) for v in losses):
        return math.inf
    ref = sum(reference.losses) / len(reference.losses)
    cand = sum(losses) / len(losses)
    return abs(cand - ref) / max(abs(ref), 1e-12)


def _show(setting: str, value: Any) -> str:
    if setting == "threads":
        return f"{value} thread{'s' if value != 1 else ''}"
    if setting in ("tf32", "cudnn_benchmark"):
        return f"{setting} {'on' if value else 'off'}"
    if setting == "step_graph":
        return "the captured step" if value else "eager steps"
    if setting == "compile":
        return f"compile ({value})" if value else "eager"
    if setting == "optimizer_kernel":
        return f"{value} optimizer"
    return str(value)


def _unmeasured(plan: Plan, why: str) -> Plan:
    return plan.replace(probe=Choice(0.0, why))
