"""The probe of a single training: one plan variant's steps timed on the real model and data.

Each measurement builds the variant's kit (`kit.py`, the same builder the loop uses), runs its
checked steps (losses read) or one warm-up step, then its timed steps, and puts the weights,
buffers, train mode and random state back in place, so training starts from exactly what it
would have started from without the probe. A variant that fails (an op compile cannot trace,
a capture error, out of memory) is a Measurement with its error: dropped, never a crash.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpufill.engine.backend import backend_flags, is_out_of_memory, synchronize
from gpufill.engine.batches import Batches
from gpufill.engine.config import FitConfig
from gpufill.engine.kit import Kit, build_kit
from gpufill.engine.step_graph import capture
from gpufill.engine.measure.deadline import Abandoned, deadline
from gpufill.engine.measure.resolver import CHECK_STEPS, Measurement, label
from gpufill.engine.snapshot import preserved_weights
from gpufill.engine.measure.timing import batch_stream
from gpufill.engine.hardware import Hardware
from gpufill.engine.plan import Plan


class FitProbe:
    def __init__(self, model: nn.Module, cfg: FitConfig, loss_fn: Callable[[Any, Any], Any], batches: Batches, device: torch.device, *,
                 clock: Callable[[], float] = time.perf_counter):
        self.model, self.cfg, self.loss_fn, self.batches, self.device, self.clock = model, cfg, loss_fn, batches, device, clock
        self.kits: dict[str, Kit] = {}

    def measure(self, plan: Plan, *, timed_steps: int, check: bool, limit: float | None = None) -> Measurement:
        started = self.clock()
        try:
            with backend_flags(plan), preserved_weights(self.model, self.device), deadline(limit):
                return self._run(plan, timed_steps, check, started)
        except Abandoned:  # past the probe's deadline (the weights are back in place): nothing half-built is kept
            self.kits.pop(label(plan), None)
            if plan.compile.value:
                torch._dynamo.reset()  # a trace or compile cut off midway
            raise
        except Exception as error:  # noqa: BLE001 - a candidate that fails is dropped with its reason
            if is_out_of_memory(error) and self.device.type == "cuda":
                torch.cuda.empty_cache()
            text = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
            return Measurement(None, cost_s=self.clock() - started, error=f"{type(error).__name__}: {text}" if text else type(error).__name__)

    def release(self) -> None:
        self.kits.clear()

    def _run(self, plan: Plan, timed_steps: int, check: bool, started: float) -> Measurement:
        name = label(plan)
        kit = self.kits.get(name)
        setup = 0.0
        fresh = kit is None
        if kit is None:
            tick = self.clock()
            kit = build_kit(self.model, plan, self.cfg, self.loss_fn, self.device)
            if kit.compile_error is not None:
                raise kit.compile_error
            if plan.step_graph.value:
                kit.graph, _ = capture(kit.eager, self.batches, plan.effective_batch.value)
            self.kits[name] = kit
            setup = self.clock() - tick
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        stream = batch_stream(self.batches, plan.effective_batch.value, self.device)
        self.model.train()
        losses = []
        for index in range(CHECK_STEPS if check else 1):
            tick = self.clock()
            kit.totals.reset()
            batch = next(stream)
            kit.step(batch)
            if check:
                kit.totals.samples = batch.size
                losses.append(kit.totals.read()["loss"])  # a sync: the probe's, never the training's
            if index == 0 and fresh and kit.compiled:
                synchronize(self.device)
                setup += self.clock() - tick  # the first compiled call traces and compiles
        synchronize(self.device)
        if self.device.type == "cpu":
            # A CPU step is done when it returns: each is timed alone and the median kept, so one step stalled by
            # another process (10x on a busy 2-core box) neither sizes the probe's budget nor decides a setting.
            times = []
            for _ in range(timed_steps):
                tick = self.clock()
                kit.step(next(stream))
                times.append(self.clock() - tick)
            step_s = statistics.median(times)
        else:  # the device's queue overlaps launches with work: the block's mean is its throughput
            tick = self.clock()
            for _ in range(timed_steps):
                kit.step(next(stream))
            synchronize(self.device)
            step_s = (self.clock() - tick) / timed_steps
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
        kit.optimizer.zero_grad(set_to_none=True)
        return Measurement(step_s, tuple(losses), setup, self.clock() - started, None, peak)


def probe_context(cfg: FitConfig, plan: Plan, hardware: Hardware) -> dict[str, Any]:
    """What besides the model's shape and the batch's makes two probes interchangeable."""
    requested = {name: getattr(cfg, name) for name in ("precision", "tf32", "cudnn_benchmark", "compile", "cuda_graph", "threads", "optimizer_kernel")}
    optimizer = cfg.optimizer if isinstance(cfg.optimizer, str) else "factory"
    return {"effective": plan.effective_batch.value, "micro": plan.micro_batch.value, "placement": plan.data_placement.value,
            "loss": plan.loss.value, "optimizer": optimizer, "clip": cfg.grad_clip, "cores": hardware.cpu_count, "threads_now": torch.get_num_threads(),
            "torch": torch.__version__, **requested}
