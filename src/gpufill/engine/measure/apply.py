"""The measured choices, run on the real training before its first epoch.

Order: the batch search first (the compile measurement must time the micro-batch that
will be used), then compile. Both run real steps on the real model inside
`state.preserved`, so training starts from exactly the weights, optimizer state and
random state it would have started from without them; their outcome (or a cached one
for the same model shape and device) goes into the Plan with the numbers that decided it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from gpufill.engine.backend import is_out_of_memory
from gpufill.engine.batches import signature
from gpufill.engine.batching import lr_reference_batch, lr_scale_factor
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import Hardware
from gpufill.engine.measure.batch import BatchSearchResult, BatchTrial, search_batch
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.measure.compile import CompileMeasurement, cached_compile_choice, time_compile
from gpufill.engine.measure.timing import batch_stream, measure_batch
from gpufill.engine.measure.state import preserved

if TYPE_CHECKING:
    from gpufill.engine.distributed import Distributed
    from gpufill.engine.plan import Plan
    from gpufill.engine.precision import Precision

# The smallest micro-batch tried is the effective batch / this (e.g. 128 -> 8).
MICRO_RANGE = 16
# With tune_effective_batch: keep at least this many optimizer steps per epoch.
MIN_STEPS_PER_EPOCH = 4


class Trainable(Protocol):
    """What the measurements need of a training (the loop's Training)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    device: torch.device
    cfg: FitConfig
    plan: Plan
    events: list[str]
    compiled: bool

    def step(self, batch: Any) -> Any: ...
    def set_micro_batch(self, micro: int, reason: str) -> None: ...
    def rescale_lr(self, factor: float) -> None: ...
    def use_compiled(self, reason: str | None = None) -> None: ...
    def use_eager(self, choice: Choice[bool]) -> None: ...
    def fall_back_to_eager(self, error: BaseException) -> None: ...


class MeasuredChoices:
    def __init__(self, run: Trainable, batches: Any, hardware: Hardware, sample: Any, n_train: int | None, ddp: Distributed | None = None,
                 largest_micro: int | None = None):
        self.run, self.batches, self.hardware, self.n_train, self.ddp = run, batches, hardware, n_train, ddp
        self.largest_micro = largest_micro
        """A user's DataLoader: its batch (a micro-batch cannot be larger than what the loader gives)."""
        self.sample_signature = signature(sample)
        self.cache = TuneCache(run.cfg.tune_cache)

    # -- batch size ---------------------------------------------------------------------
    def search_batch(self) -> None:
        run = self.run
        if not run.plan.batch_search.value:
            return
        scope_effective = run.cfg.tune_effective_batch
        effective = run.plan.effective_batch.value
        if scope_effective:
            limit = max(effective, _power_of_two_at_most((self.n_train or effective) // MIN_STEPS_PER_EPOCH))
            start = max(1, effective // 4)
        else:
            limit = min(effective, self.largest_micro or effective)
            start = max(1, limit // MICRO_RANGE)
        budget = int(self.hardware.total_memory_bytes * run.cfg.memory_margin) if self.hardware.is_cuda else None
        key = self._key("batch", effective=effective, scope="effective" if scope_effective else "micro",
                        precision=run.plan.precision.value, limit=limit)
        cached = self.cache.get(key)
        if cached is not None:
            result, source = BatchSearchResult.from_dict(cached), "cached measurement"
        else:
            result = search_batch(lambda size: self._measure(size, scope_effective), start=start, limit=limit, budget_bytes=budget)
            self.cache.put(key, result.to_dict())
            source = "measured"
        if self.ddp is not None:  # each rank measured alone; all follow rank 0
            result = self.ddp.broadcast(result)
            source += f" on rank 0 of {self.ddp.world_size}"
        where = f"within {run.cfg.memory_margin:.0%} of device memory" if budget else "no device memory limit on CPU"
        detail = f"fastest {source} ({where}; {result.summary()})"
        size = result.best.size
        if scope_effective:
            self._use_effective_batch(size, detail)
        else:
            run.set_micro_batch(size, f"{size}: {detail}")
        run.events.append(f"batch search: {detail} -> {size}")

    def _measure(self, size: int, scope_effective: bool) -> BatchTrial:
        run = self.run
        effective = size if scope_effective else run.plan.effective_batch.value
        saved = run.plan
        run.plan = run.plan.replace(
            effective_batch=Choice(effective, "measuring"), micro_batch=Choice(size, "measuring"), accumulation=Choice(-(-effective // size), "measuring")
        )
        try:
            with preserved(run.model, run.optimizer, run.precision, run.device):
                return measure_batch(run.step, self.batches, size=size, effective=effective, device=run.device, is_oom=is_out_of_memory)
        finally:
            run.plan = saved

    def _use_effective_batch(self, size: int, detail: str) -> None:
        run, cfg = self.run, self.run.cfg
        reference = lr_reference_batch(cfg)
        factor = lr_scale_factor(size, reference, cfg.lr_scale_rule)
        run.rescale_lr(factor / run.plan.lr_scale.value)
        run.plan = run.plan.replace(
            effective_batch=Choice(size, f"{size}: {detail}; allowed by tune_effective_batch"),
            micro_batch=Choice(size, "the whole effective batch per step"),
            accumulation=Choice(1, "1: the micro-batch is the whole effective batch"),
            lr_scale=Choice(factor, f"{cfg.lr_scale_rule} rule: effective batch {size} / reference {reference} -> lr x {factor:.3g}"),
        )

    # -- compile ------------------------------------------------------------------------
    def compile(self) -> None:
        run = self.run
        if not run.plan.compile.value:
            return
        if run.cfg.compile != "auto":
            run.use_compiled()  # requested: no measurement
            return
        key = self._key("compile", micro=run.plan.micro_batch.value, precision=run.plan.precision.value)
        choice = cached_compile_choice(self.cache, key, self._measure_compile)
        if choice is None:
            return  # compile failed: run fell back to eager with the reason
        if choice.value and run.compiled:  # measured just now: the compiled forward is in place
            run.plan = run.plan.replace(compile=choice)
        elif choice.value:
            run.use_compiled(choice.reason)
        else:
            run.use_eager(choice)
        run.events.append(f"compile: {choice.reason}")

    def _measure_compile(self) -> CompileMeasurement | None:
        run = self.run

        def use_compiled() -> bool:
            run.use_compiled()
            return run.compiled

        with preserved(run.model, run.optimizer, run.precision, run.device):
            stream = batch_stream(self.batches, run.plan.effective_batch.value, run.device)
            return time_compile(run.step, stream, run.device, use_compiled=use_compiled, on_error=run.fall_back_to_eager)

    def _key(self, kind: str, **settings: Any) -> str:
        return shape_key(kind, self.run.model, self.sample_signature, self.hardware.name, **settings)


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


