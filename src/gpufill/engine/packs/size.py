"""How many models to fuse, per shape and device: measured on a sample batch before any pack
exists (`forecasting/packs.py` asks, through `choose_pack_size`). How a pack's step runs (compiled, graph-captured) is
measured on the real pack: `probe.py`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpufill.engine.backend import is_out_of_memory, synchronize
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import context_bytes, detect
from gpufill.engine.losses import NAMED, stand_in_errors
from gpufill.engine.measure.ops import count_ops
from gpufill.engine.packs.stacked import pack_kinds, pack_module, why_not_packed
from gpufill.engine.optim_eager import eager_class
from gpufill.engine.packs.optim import PackAdamW
from gpufill.engine.plan import DataFacts, make_plan

Pair = tuple[torch.Tensor, torch.Tensor]


CANDIDATE_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Pack sizes tried, doubling: a GPU's step stays launch-bound well past 8 small models."""

MEASURED_STEPS = 4
"""Timed steps per candidate size (after one warm-up step)."""
MIN_GAIN = 1.05
"""Doubling K stops once it adds less than this to the best samples/s so far (the curve has flattened)."""
KIND_GAIN = 1.05
"""torch.func's vmap replaces a family's hand-written fused kernels only when at least this much faster."""
FUSE_GAIN = 1.2
"""A shape trains fused only where its best pack is at least this much faster than one model at a time. Fused and plain
kernels differ in a trial's last bits, so a borderline answer (a demo's TCN measured 1.00x on one run, 1.15x on another)
would make two runs of one file differ for a gain of a few percent."""
CONFIRM_PAIRS = 2
"""Fused or not changes the last bits of a trial's numbers (a pack member's kernels are not the plain model's), so
the answer is the median of interleaved pairs of one model and the best pack (the first timing and this many more),
not of one timing each that a moment's load can flip: a demo measured LSTM packs at 0.70x on a busy box and at 19.6x
beside it on another run, and the two runs' trials differed by 1e-7."""
MEASURE_SHARE = 0.1
"""Pack sizes are measured only where measuring costs at most this share of the trainings it decides (in one model's
steps): what a measurement can gain is a share of the work, so on less work it cannot repay itself. A campaign of 16
tiny trials measured for 0.2 s and then trained in 0.17 s."""


@dataclass(frozen=True, slots=True)
class PackSizeChoice:
    """How many models to fuse for one shape on this device, measured, with the reason."""

    size: int
    samples_per_s: dict[int, float]
    reason: str
    ops_per_step: dict[int, int] = field(default_factory=dict)
    """Computing operators (about one kernel launch each) of one training step per K, when counted."""
    peak_bytes: dict[int, int] = field(default_factory=dict)
    """Device memory a step of K models allocated at its peak (CUDA only): what admission adds up."""
    kind: str | None = None
    """How the pack runs (`packs.stacked`: hand-written fused kernels or torch.func vmap); None unfused."""


def choose_pack_size(build, sample: Pair, *, config: FitConfig, name: str, candidates: Sequence[int] = CANDIDATE_SIZES,
                     data_bytes: int = 0, trainings: int | None = None) -> PackSizeChoice:
    """Whether and how many models of one shape to fuse for trainings of `config` on its device: unfused, with the
    reason, where a pack cannot train them (a schedule given as a function of the step; a model that neither
    fused kernels nor vmap can batch, `name` saying whose), else measured (`measure_pack_size`) at the batch a plan
    gives such a training, each size's peak within `config.memory_margin` of the device. `trainings`: how many of
    them wait; where measuring would cost more than MEASURE_SHARE of their whole training, nothing is measured and
    they train as one pack (`unmeasured`)."""
    if callable(config.schedule):
        return PackSizeChoice(size=1, samples_per_s={}, reason="unfused: the schedule is a function of the step (a pack runs a named one)")
    # Any elementwise loss tests vmap's batching rules alike: mse stands for the trainings' own.
    why_not = why_not_packed(build, NAMED["mse"], (sample[0][:8], sample[1][:8]))
    if why_not is not None:
        return PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: {name}: {why_not}")
    device = str(config.device)
    batch = make_plan(detect(device), DataFacts(n_train=sample[0].shape[0], bytes_total=0), config).effective_batch.value
    if trainings is not None and (small := unmeasured(build, sample, trainings, -(-sample[0].shape[0] // batch) * config.epochs, candidates)):
        return small
    return measure_pack_size(build, sample, batch=batch, device=device, candidates=candidates, data_bytes=data_bytes,
                             memory_budget=_memory_budget(device, config.memory_margin))


def measuring_steps(candidates: Sequence[int], steps: int = MEASURED_STEPS) -> int:
    """What measuring pack sizes costs, in one model's steps: each candidate K's warm-up and timed steps, K models a step."""
    return sum(k * (steps + 1) for k in candidates)


def unmeasured(build, sample: Pair, trainings: int, steps_each: int, candidates: Sequence[int]) -> PackSizeChoice | None:
    """All `trainings` as one pack, without measuring, where measuring would cost more than MEASURE_SHARE of their
    whole training (`steps_each` optimizer steps each): then whatever it found could not repay it (None otherwise)."""
    work, cost = trainings * steps_each, measuring_steps(candidates)
    size = max((k for k in candidates if k <= trainings), default=1)
    if cost <= MEASURE_SHARE * work or size < 2:
        return None
    kind = pack_kinds(build, (sample[0][:8], sample[1][:8]))[0]
    return PackSizeChoice(size=size, samples_per_s={}, kind=kind,
                          reason=(f"a pack of {size} ({kind}), not measured: these {trainings} trainings' {work} optimizer steps in all are "
                                  f"too few to repay measuring pack sizes ({cost} steps' worth, more than {MEASURE_SHARE:.0%} of them): trained at once"))


def _memory_budget(device: str, margin: float) -> int | None:
    """memory_margin of the device, less what this process holds outside the allocator (CUDA only)."""
    if not device.startswith("cuda"):
        return None
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return int(margin * total) - (context_bytes(device) or 0)


def measure_pack_size(build, sample: Pair, *, batch: int, device: str, candidates: Sequence[int] = CANDIDATE_SIZES, steps: int = MEASURED_STEPS,
                      count: bool = False, data_bytes: int = 0, memory_budget: int | None = None, min_gain: float | None = MIN_GAIN) -> PackSizeChoice:
    """Time a few training steps unfused (size 1) and fused at each candidate K; keep the fastest.

    `build()` returns a fresh plain model. Fusion is used only where it measured FUSE_GAIN faster than the plain path
    on this device, on interleaved pairs (on a small CPU, plain cuDNN-free kernels can win).
    Candidates are tried in increasing order until one adds less than `min_gain` over the fused sizes before it
    (None: try them all) or does not
    fit in memory: a pack's peak (the step's, plus `data_bytes` per model that a pack keeps on
    the device) must stay within `memory_budget` (CUDA; the campaign's memory_margin of the
    device). With `count`, each step's operators are counted too (one extra step).
    """
    dev = torch.device(device)
    x, y = sample[0][:batch].to(dev), sample[1][:batch].to(dev)
    kinds = pack_kinds(build, (x[:8], y[:8]))
    kind = kinds[0]
    rates: dict[int, float] = {}
    ops: dict[int, int] = {}
    peaks: dict[int, int] = {}
    stopped = ""
    for k in sorted(candidates):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            seconds, counted = _time_candidate(_training_step(build, k, x, y, dev, kind), steps, dev, count=count)
        except Exception as error:
            if k == 1 or not is_out_of_memory(error):
                raise
            stopped = f"; {k} did not fit in memory"
            break
        rates[k] = k * x.shape[0] * steps / seconds
        if counted is not None:
            ops[k] = counted
        if dev.type == "cuda":
            peaks[k] = int(torch.cuda.max_memory_allocated(dev)) + k * data_bytes
            torch.cuda.empty_cache()
            if k > 1 and memory_budget is not None and peaks[k] > memory_budget:
                del rates[k], peaks[k]
                stopped = f"; {k} would pass the memory margin ({memory_budget / 2**30:.1f} GiB)"
                break
        # The curve is the fused packs' own: size 1 runs another implementation (cuDNN's whole-sequence LSTM against
        # a pack's step-by-step recurrence), so a pack of 2 slower than one model says nothing of a pack of 16.
        best_before = max((r for kk, r in rates.items() if 1 < kk < k), default=None)
        if best_before is not None and min_gain is not None and rates[k] < min_gain * best_before:
            stopped = f"; stopped at {k}: less than {min_gain - 1:.0%} over the best so far"
            break
    best = max(rates, key=rates.__getitem__)
    versus = ""
    fused_best = max((kk for kk in rates if kk > 1), key=rates.__getitem__, default=None)
    confirmed: set[int] = set()
    while fused_best is not None and fused_best not in confirmed:
        # Fused or not changes a trial's last bits: answered on interleaved pairs, not one timing. A size whose one
        # timing was lucky (a neighbour paused) falls back to its pairs' median, and the next fastest is confirmed too.
        pairs = [rates[fused_best] / rates[1]]
        for _ in range(CONFIRM_PAIRS):
            plain_s, _ = _time_candidate(_training_step(build, 1, x, y, dev, kind), steps, dev, count=False)
            fused_s, _ = _time_candidate(_training_step(build, fused_best, x, y, dev, kind), steps, dev, count=False)
            pairs.append(fused_best * plain_s / fused_s)
        rates[fused_best] = rates[1] * statistics.median(pairs)  # the gain reported is the pairs' median
        confirmed.add(fused_best)
        fused_best = max((kk for kk in rates if kk > 1), key=rates.__getitem__)
    if fused_best is not None:
        best = fused_best if rates[fused_best] / rates[1] >= FUSE_GAIN else 1
    if best > 1 and len(kinds) > 1:  # the other kind at the size the default kind found best
        other = kinds[1]
        try:
            seconds, _ = _time_candidate(_training_step(build, best, x, y, dev, other), steps, dev, count=False)
            other_rate = best * x.shape[0] * steps / seconds
            ratio = other_rate / rates[best]
            if ratio >= KIND_GAIN:
                versus = f"; {other} measured {ratio:.2f}x {kind} at that size"
                kind, rates[best] = other, other_rate
            else:
                versus = f"; {kind} kept: {other} {ratio:.2f}x it"
        except Exception as error:  # noqa: BLE001 - the other kind is an option, never a failure
            versus = f"; {other} failed ({type(error).__name__})"
    gain = rates[best] / rates[1]
    fused_rates = [r for kk, r in rates.items() if kk > 1]
    if best > 1:
        reason = f"fused packs of {best} ({kind}): {gain:.2f}x the samples/s of one model at a time (measured on {dev.type}, K up to {max(rates)}{stopped}{versus})"
    elif fused_rates:
        reason = (f"unfused: no fused pack size was {FUSE_GAIN:.1f}x one model at a time on {dev.type} (best {max(fused_rates) / rates[1]:.2f}x"
                  f"{stopped})")
    else:
        reason = f"unfused: no fused pack size could be measured on {dev.type}{stopped}"
    return PackSizeChoice(size=best, samples_per_s=rates, reason=reason, ops_per_step=ops, peak_bytes=peaks, kind=kind if best > 1 else None)


def _time_candidate(step, steps: int, dev: torch.device, *, count: bool) -> tuple[float, int | None]:
    """Seconds for `steps` steps after one warm-up step (allocator, kernel selection), and the
    operators of one step when counted. The candidate's tensors go when this returns."""
    step()
    counted = count_ops(step).total if count else None
    synchronize(dev)
    tick = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(dev)
    return time.perf_counter() - tick, counted


def _training_step(build, k: int, x: torch.Tensor, y: torch.Tensor, dev: torch.device, kind: str | None = None):
    """One training step of a plain model (k = 1, torch's AdamW) or of a pack of k (of `kind`), as a closure."""
    models = [build() for _ in range(k)]
    if k == 1:
        model = models[0].to(dev)
        # The baseline a careful user writes: torch's fused AdamW kernel (CPU and CUDA).
        # eager_class: nothing here compiles, so its first call skips torch's torch._dynamo import (~1 s of a worker's start).
        optimizer = eager_class(torch.optim.AdamW)(model.parameters(), lr=1e-3, fused=dev.type in ("cpu", "cuda"))

        def step() -> None:
            stand_in_errors(model(x), y).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    fused = pack_module(models, kind).to(dev)
    pack_optimizer = PackAdamW(list(fused.parameters()), torch.full((k,), 1e-3, device=dev), torch.zeros(k, device=dev))
    xs, ys = x.expand(k, *x.shape).contiguous(), y.expand(k, *y.shape).contiguous()
    everyone = torch.ones(k, dtype=torch.bool, device=dev)

    def fused_step() -> None:
        stand_in_errors(fused(xs), ys).flatten(1).mean(dim=1).sum().backward()
        pack_optimizer.step(everyone)
        pack_optimizer.zero_grad()

    return fused_step
