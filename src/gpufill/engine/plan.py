"""Speed settings for one training: hardware + model + data + user settings -> Plan.

Every setting is a `Choice`: the value and the reason it was chosen. "auto" is resolved
here, once, from facts; explicit values are checked against the hardware and kept.
The loop (`loop.py`) applies the plan; nothing else decides or toggles these settings.
The data and batch choices are in `batching.py`; the loss, optimizer and schedule choices
are made where those objects are built (`losses.py`, `optim.py`) and recorded here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from gpufill.engine import batching
from gpufill.engine.batching import (  # noqa: F401  (re-exported: where callers have always found them)
    DEFAULT_REFERENCE_BATCH,
    RESIDENT_SHARE,
    DataFacts,
    LoaderSettings,
    lr_reference_batch,
    lr_scale_choice,
    lr_scale_factor,
)
from gpufill.engine.choice import Choice
from gpufill.engine.config import Auto, OptimizerKernel, PrecisionName, SpeedSettings
from gpufill.engine.hardware import Hardware, fused_optimizer_devices
from gpufill.errors import InputError
# torch.compile costs tens of seconds up front; below this many optimizer steps it
# rarely pays back for the small models gpufill trains.
COMPILE_MIN_STEPS = 2000
# The batch search times ~40 optimizer steps; below this many it would cost more than it can save.
BATCH_SEARCH_MIN_STEPS = 400
# Timing the loader candidates starts worker processes for each (seconds); worth it only
# for trainings with many batches.
LOADER_TUNING_MIN_STEPS = 200


_UNSET: Choice[Any] = Choice(None, "set when training starts")


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The speed settings chosen for one training, each with its reason."""

    device: Choice[str]
    precision: Choice[PrecisionName]
    tf32: Choice[bool]
    cudnn_benchmark: Choice[bool]
    compile: Choice[bool]
    data_placement: Choice[str]
    loader: Choice[LoaderSettings | None]
    loader_tuning: Choice[bool]
    effective_batch: Choice[int]
    micro_batch: Choice[int]
    accumulation: Choice[int]
    lr_scale: Choice[float]
    grad_scaler: Choice[bool]
    optimizer_kernel: Choice[OptimizerKernel]
    step_sync: Choice[bool]
    batch_search: Choice[bool]
    # Set by the loop when it builds them (they need the model and the training's length).
    loss: Choice[str] = _UNSET
    optimizer: Choice[str] = _UNSET
    schedule: Choice[str] = _UNSET
    step_graph: Choice[bool] = Choice(False, "off: single trainings step eagerly (fused packs measure it)")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision.value)

    def replace(self, **choices: Choice[Any]) -> Plan:
        return dataclasses.replace(self, **choices)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """{setting: {"value": ..., "reason": ...}}, JSON-ready."""
        out: dict[str, dict[str, Any]] = {}
        for field in dataclasses.fields(self):
            choice: Choice[Any] = getattr(self, field.name)
            value = dataclasses.asdict(choice.value) if dataclasses.is_dataclass(choice.value) else choice.value
            out[field.name] = {"value": value, "reason": choice.reason}
        return out


def make_plan(hardware: Hardware, data: DataFacts, settings: SpeedSettings) -> Plan:
    """Resolve every setting in a fixed order: device facts first, then numerics, then batching."""
    settings.validate()
    precision = _precision(hardware, settings.precision)
    placement = batching.data_placement(hardware, data, settings)
    effective = batching.effective_batch(data, settings)
    micro = batching.micro_batch(data, effective.value, settings.micro_batch)
    accumulation = math.ceil(effective.value / micro.value)
    steps = batching.steps_per_epoch(data, effective.value)
    return Plan(
        device=Choice(hardware.device, _device_reason(hardware, settings.device)),
        precision=precision,
        tf32=_tf32(hardware, settings.tf32),
        cudnn_benchmark=_cudnn_benchmark(hardware, settings.cudnn_benchmark),
        compile=_compile(hardware, settings.compile, steps_per_epoch=steps),
        data_placement=placement,
        loader=batching.loader_settings(hardware, data, placement.value, settings.num_workers),
        loader_tuning=batching.loader_tuning(data, placement.value, settings.num_workers),
        effective_batch=effective,
        micro_batch=micro,
        accumulation=Choice(
            accumulation,
            "1: the micro-batch is the whole effective batch"
            if accumulation == 1
            else f"{accumulation} micro-batches of {micro.value} per optimizer step keep the effective batch {effective.value}",
        ),
        lr_scale=lr_scale_choice(effective.value, settings, data),
        grad_scaler=Choice(
            precision.value == "fp16",
            "fp16 has a narrow exponent range: loss scaling keeps small gradients from flushing to zero"
            if precision.value == "fp16"
            else f"not needed with {precision.value}",
        ),
        optimizer_kernel=_optimizer_kernel(hardware, settings.optimizer_kernel),
        step_sync=Choice(True, "requested: the loss is read every step (one host-device sync per step)")
        if settings.sync_every_step
        else Choice(False, "losses accumulate on the device and are read once per epoch: no sync in the hot loop"),
        batch_search=_batch_search(hardware, settings),
    )


def _optimizer_kernel(hardware: Hardware, requested: OptimizerKernel | Auto) -> Choice[OptimizerKernel]:
    supported = fused_optimizer_devices()
    if requested == "fused" and hardware.device_type not in supported:
        raise InputError(
            f"this torch has no fused optimizer kernels for {hardware.device_type}", field="optimizer_kernel", fix="use foreach, for-loop or auto"
        )
    if requested != "auto":
        return Choice(requested, "requested")
    if hardware.device_type in supported:
        return Choice("fused", f"fused Adam/AdamW/SGD: one kernel updates every parameter on {hardware.device_type} (no per-parameter loop)")
    if hardware.is_cuda:
        return Choice("foreach", "multi-tensor kernels: one launch per parameter group")
    return Choice("for-loop", f"no fused or multi-tensor optimizer kernels for {hardware.device_type} in this torch")


def _device_reason(hardware: Hardware, requested: str) -> str:
    if requested != "auto":
        return f"requested ({hardware.name})"
    if hardware.is_cuda:
        return f"first visible GPU: {hardware.name}"
    return f"no GPU visible to torch: training on the CPU ({hardware.cpu_count} cores)"


def _precision(hardware: Hardware, requested: PrecisionName | Auto) -> Choice[PrecisionName]:
    arch = _arch(hardware)
    if requested == "bf16" and hardware.is_cuda and not hardware.bf16_supported:
        raise InputError(
            f"bf16 needs compute capability 8.0 or later and this GPU is {arch}",
            field="precision",
            fix="set precision to fp16 (with loss scaling) or auto",
        )
    if requested in ("fp16", "bf16") and hardware.device_type == "mps":
        raise InputError("mixed precision is not supported on MPS here", field="precision", fix="set precision to fp32 or auto")
    if requested == "fp16" and not hardware.is_cuda:
        raise InputError("fp16 autocast has no fast CPU kernels", field="precision", fix="set precision to bf16, fp32 or auto")
    if requested != "auto":
        return Choice(requested, "requested")
    if hardware.is_cuda and hardware.bf16_supported:
        return Choice("bf16", f"bf16 autocast: the GPU supports bf16 ({arch}); same exponent range as fp32, no loss scaling")
    if hardware.is_cuda:
        return Choice("fp16", f"fp16 autocast with loss scaling: the GPU lacks bf16 ({arch})")
    if hardware.bf16_supported:
        return Choice("fp32", "fp32: CPU; it has bf16 instructions, so precision=bf16 may be faster (not measured)")
    return Choice("fp32", f"fp32: {hardware.device_type.upper()} without fast bf16 instructions")


def _tf32(hardware: Hardware, requested: bool | Auto) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested")
    if hardware.tf32_supported:
        return Choice(True, f"fp32 matmuls and convolutions on TF32 tensor cores ({_arch(hardware)}): several times fp32 speed, 10-bit mantissa is enough for training")
    return Choice(False, "no TF32 tensor cores (needs a GPU of compute capability 8.0+)")


def _cudnn_benchmark(hardware: Hardware, requested: bool | Auto) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested")
    if hardware.is_cuda:
        return Choice(True, "batches keep their shapes: cuDNN's autotuned kernels are reused every step")
    return Choice(False, "no cuDNN on this device")


def _compile(hardware: Hardware, requested: bool | Auto, *, steps_per_epoch: int | None) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested; falls back to eager on any compile error" if requested else "requested: off")
    if not hardware.is_cuda:
        return Choice(False, "off on CPU by default: compile time (tens of seconds) rarely pays back for small models")
    # The epoch count is not a data fact; the loop re-plans with the total step count.
    per_epoch = f"{steps_per_epoch} steps per epoch" if steps_per_epoch else "steps per epoch not known yet"
    return Choice(True, f"CUDA: fused kernels cut launch overhead ({per_epoch})")


def _batch_search(hardware: Hardware, settings: SpeedSettings) -> Choice[bool]:
    if settings.batch_search != "auto":
        return Choice(bool(settings.batch_search), "requested")
    if settings.micro_batch != "auto":
        return Choice(False, "off: the micro-batch is given")
    if not hardware.is_cuda:
        # Measured on this project's CPU benchmarks: micro-batches below the effective batch
        # were within noise of it, so the search would only add run-to-run variation.
        return Choice(False, "off on CPU by default: smaller micro-batches measured no faster; set batch_search=True to measure")
    return Choice(True, "measure samples/s at several micro-batch sizes and keep the fastest within the memory margin")


def for_training_length(plan: Plan, total_steps: int | None) -> Plan:
    """Settle the choices that pay back only over enough optimizer steps: compile, batch search, loader tuning.

    `total_steps` None (a stream without steps_per_epoch): unknown, so "auto" leaves them off."""
    if total_steps is None:
        unknown = "off: the training's length is unknown (an IterableDataset without steps_per_epoch); request it to measure"
        if plan.compile.value and not plan.compile.reason.startswith("requested"):
            plan = plan.replace(compile=Choice(False, unknown))
        if plan.batch_search.value and not plan.batch_search.reason.startswith("requested"):
            plan = plan.replace(batch_search=Choice(False, unknown))
        return plan
    plan = compile_for_steps(plan, total_steps)
    if plan.loader_tuning.value and total_steps < LOADER_TUNING_MIN_STEPS:
        plan = plan.replace(
            loader_tuning=Choice(False, f"off: only {total_steps} batches; timing loader settings would not pay back (needs {LOADER_TUNING_MIN_STEPS}+)")
        )
    if plan.batch_search.value and not plan.batch_search.reason.startswith("requested") and total_steps < BATCH_SEARCH_MIN_STEPS:
        plan = plan.replace(
            batch_search=Choice(False, f"off: only {total_steps} optimizer steps; measuring (~40 steps) would not pay back (needs {BATCH_SEARCH_MIN_STEPS}+)")
        )
    return plan


def compile_for_steps(plan: Plan, total_steps: int) -> Plan:
    """An "auto" compile on CUDA is kept only when the training is long enough to pay back."""
    if not plan.compile.value or plan.compile.reason.startswith("requested"):
        return plan
    if total_steps < COMPILE_MIN_STEPS:
        return plan.replace(
            compile=Choice(False, f"off: only {total_steps} optimizer steps; compile time would not pay back (needs {COMPILE_MIN_STEPS}+)")
        )
    return plan.replace(compile=Choice(True, f"{total_steps} optimizer steps amortise the compile time; eager fallback on any error"))


def _arch(hardware: Hardware) -> str:
    if hardware.compute_capability is None:
        return hardware.device_type
    major, minor = hardware.compute_capability
    return f"sm_{major}{minor}"

