"""Speed settings for one training: hardware + model + data + user settings -> Plan.

Every setting is a `Choice`: the value and the reason it was chosen. "auto" is resolved
here, once, from facts; explicit values are checked against the hardware and kept.
`fit.py` applies the plan; nothing else decides or toggles these settings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import torch

from gpufill.errors import InputError
from gpufill.engine.hardware import Hardware, free_memory_bytes, fused_optimizer_devices

T = TypeVar("T")
Auto = Literal["auto"]
Precision = Literal["bf16", "fp16", "fp32"]
LrScaleRule = Literal["linear", "sqrt", "none"]
OptimizerKernel = Literal["fused", "foreach", "for-loop"]

# The batch size the default learning rate (1e-3, Adam) is tuned for in the models here.
DEFAULT_REFERENCE_BATCH = 128
# Keep device-resident data under this share of free device memory: the rest is for
# weights, optimizer state and activations.
RESIDENT_SHARE = 0.25
# torch.compile costs tens of seconds up front; below this many optimizer steps it
# rarely pays back for the small models gpufill trains.
COMPILE_MIN_STEPS = 2000
# The batch search times ~40 optimizer steps; below this many it would cost more than it can save.
BATCH_SEARCH_MIN_STEPS = 400
# Timing the loader candidates starts worker processes for each (seconds); worth it only
# for trainings with many batches.
LOADER_TUNING_MIN_STEPS = 200


@dataclass(frozen=True, slots=True)
class Choice(Generic[T]):
    """One planned setting: its value and why."""

    value: T
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderSettings:
    """DataLoader settings for data that is not resident on the device."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool


@dataclass(kw_only=True, slots=True)
class SpeedSettings:
    """What the user asks for; each "auto" becomes a concrete Choice in the Plan."""

    device: str = "auto"
    """"auto" (first GPU, else CPU), or a torch device string such as "cuda:1" or "cpu"."""
    precision: Precision | Auto = "auto"
    """bf16 / fp16 autocast or plain fp32."""
    tf32: bool | Auto = "auto"
    cudnn_benchmark: bool | Auto = "auto"
    compile: bool | Auto = "auto"
    data_placement: Literal["device", "loader"] | Auto = "auto"
    """"device": tensors moved to the device once and batched there by index."""
    num_workers: int | Auto = "auto"
    """DataLoader workers when data is not resident."""
    batch_size: int | Auto = "auto"
    """Effective batch: samples per optimizer step."""
    micro_batch: int | Auto = "auto"
    """Samples per forward/backward; accumulation = ceil(batch_size / micro_batch)."""
    reference_batch: int | None = None
    """The batch the learning rate was tuned for (default: batch_size if set, else 128)."""
    lr_scale_rule: LrScaleRule = "linear"
    """How lr follows the effective batch when it differs from reference_batch."""
    memory_margin: float = 0.85
    """Share of device memory a training may plan to use."""
    optimizer_kernel: OptimizerKernel | Auto = "auto"
    """"fused" (one kernel for all parameters), "foreach" (multi-tensor) or "for-loop"."""
    sync_every_step: bool = False
    """Read the loss on the host every step, as logging loops do (off: once per epoch). For ablations."""
    batch_search: bool | Auto = "auto"
    """Measure samples/s at several micro-batch sizes and keep the fastest within memory_margin."""
    tune_effective_batch: bool = False
    """Let the batch search change the effective batch too (lr follows lr_scale_rule)."""
    tune_cache: str | Path | None = None
    """Directory caching measured choices per (model shape, device); a campaign passes its workdir."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataFacts:
    """What the plan needs to know about the training data."""

    n_train: int
    bytes_total: int
    """Bytes of all tensors (train + val) if moved to the device."""
    is_tensor: bool
    """True when the data is tensors (can be made resident); False for a per-sample Dataset."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The speed settings chosen for one training, each with its reason."""

    device: Choice[str]
    precision: Choice[Precision]
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
    precision = _precision(hardware, settings.precision)
    placement = _data_placement(hardware, data, settings)
    effective = _effective_batch(data, settings)
    micro = _micro_batch(effective.value, settings.micro_batch)
    accumulation = math.ceil(effective.value / micro.value)
    steps = max(1, math.ceil(data.n_train / effective.value))
    return Plan(
        device=Choice(hardware.device, _device_reason(hardware, settings.device)),
        precision=precision,
        tf32=_tf32(hardware, settings.tf32),
        cudnn_benchmark=_cudnn_benchmark(hardware, settings.cudnn_benchmark),
        compile=_compile(hardware, settings.compile, steps_per_epoch=steps),
        data_placement=placement,
        loader=_loader(hardware, placement.value, settings.num_workers),
        loader_tuning=_loader_tuning(placement.value, settings.num_workers),
        effective_batch=effective,
        micro_batch=micro,
        accumulation=Choice(
            accumulation,
            "1: the micro-batch is the whole effective batch"
            if accumulation == 1
            else f"{accumulation} micro-batches of {micro.value} per optimizer step keep the effective batch {effective.value}",
        ),
        lr_scale=lr_scale_choice(effective.value, settings),
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
    if requested not in ("auto", "fused", "foreach", "for-loop"):
        raise InputError(f"unknown optimizer kernel {requested!r}", field="optimizer_kernel", fix="use auto, fused, foreach or for-loop")
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


def _precision(hardware: Hardware, requested: Precision | Auto) -> Choice[Precision]:
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
        return Choice(True, "input shapes are fixed (lookback x features): cuDNN's autotuned kernels are reused every step")
    return Choice(False, "no cuDNN on this device")


def _compile(hardware: Hardware, requested: bool | Auto, *, steps_per_epoch: int) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested; falls back to eager on any compile error" if requested else "requested: off")
    if not hardware.is_cuda:
        return Choice(False, "off on CPU by default: compile time (tens of seconds) rarely pays back for small models")
    # The epoch count is not a data fact; fit.py re-plans with the total step count.
    return Choice(True, f"CUDA: fused kernels cut launch overhead ({steps_per_epoch} steps per epoch)")


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


def _loader_tuning(placement: str, requested_workers: int | Auto) -> Choice[bool]:
    if placement == "device":
        return Choice(False, "not needed: data is resident")
    if requested_workers != "auto":
        return Choice(False, "off: num_workers is given")
    return Choice(True, "time a few num_workers / prefetch settings on real batches and keep the fastest")


def for_training_length(plan: Plan, total_steps: int) -> Plan:
    """Settle the choices that pay back only over enough optimizer steps: compile, batch search, loader tuning."""
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


def _data_placement(hardware: Hardware, data: DataFacts, settings: SpeedSettings) -> Choice[str]:
    size = _human_bytes(data.bytes_total)
    if settings.data_placement == "device" and not data.is_tensor:
        raise InputError(
            "data_placement 'device' needs tensors, but the data is a per-sample Dataset",
            field="data_placement",
            fix="pass (inputs, targets) tensors or a TensorDataset, or set data_placement to auto",
        )
    if settings.data_placement != "auto":
        return Choice(settings.data_placement, "requested")
    if not data.is_tensor:
        return Choice("loader", "data is a per-sample Dataset: read through a DataLoader")
    budget = int(free_memory_bytes(hardware) * RESIDENT_SHARE)
    if data.bytes_total <= budget:
        where = "on the GPU" if hardware.is_cuda else "in memory"
        return Choice("device", f"{size} fits {where} (under {RESIDENT_SHARE:.0%} of free memory): batched by index, no DataLoader, no per-step copies")
    return Choice("loader", f"{size} exceeds {RESIDENT_SHARE:.0%} of free device memory ({_human_bytes(budget)}): streamed through a DataLoader")


def _loader(hardware: Hardware, placement: str, requested_workers: int | Auto) -> Choice[LoaderSettings | None]:
    if placement == "device":
        return Choice(None, "not used: data is resident")
    if requested_workers != "auto":
        workers, why = int(requested_workers), f"{requested_workers} workers requested"
    elif hardware.is_cuda:
        # One worker per spare core (the main process drives the GPU), at most 8.
        workers = max(0, min(8, hardware.cpu_count - 1))
        why = f"{workers} workers: one per spare core (of {hardware.cpu_count}), up to 8"
    elif hardware.cpu_count <= 2:
        workers, why = 0, f"no workers: on {hardware.cpu_count} cores they would compete with the training for CPU"
    else:
        workers = min(4, hardware.cpu_count // 2)
        why = f"{workers} workers: half of {hardware.cpu_count} cores, the rest compute"
    pin = hardware.is_cuda
    settings = LoaderSettings(
        num_workers=workers,
        prefetch_factor=4 if workers else None,
        pin_memory=pin,
        persistent_workers=workers > 0,
    )
    extras = []
    if pin:
        extras.append("pinned memory so non_blocking copies overlap compute")
    if workers:
        extras.append("persistent workers (no re-fork per epoch), 4 batches prefetched per worker")
    return Choice(settings, "; ".join([why, *extras]))


def _effective_batch(data: DataFacts, settings: SpeedSettings) -> Choice[int]:
    requested = settings.batch_size
    if requested != "auto":
        if int(requested) < 1:
            raise InputError(f"batch size must be positive, got {requested}", field="batch_size", fix="pass a positive integer or auto")
        return Choice(int(requested), "requested")
    reference = settings.reference_batch or DEFAULT_REFERENCE_BATCH
    # At least 4 optimizer steps per epoch, so tiny projects still train.
    cap = max(1, data.n_train // 4)
    if reference <= cap:
        return Choice(reference, f"the reference batch the learning rate is tuned for ({reference})")
    batch = 2 ** int(math.log2(cap)) if cap >= 1 else 1
    return Choice(batch, f"{batch}: only {data.n_train} training samples; keeps at least 4 optimizer steps per epoch")


def _micro_batch(effective: int, requested: int | Auto) -> Choice[int]:
    if requested == "auto":
        return Choice(effective, "the whole effective batch per step; an out-of-memory error halves it and doubles accumulation")
    if not 1 <= int(requested) <= effective:
        raise InputError(
            f"micro-batch {requested} must be between 1 and the effective batch {effective}",
            field="micro_batch",
            fix="lower micro_batch or raise batch_size",
        )
    return Choice(int(requested), "requested")


def lr_scale_factor(effective: int, reference: int, rule: LrScaleRule) -> float:
    """linear: lr x (B / B_ref) (Goyal et al. 2017); sqrt: lr x sqrt(B / B_ref) (Hoffer et al. 2017)."""
    ratio = effective / reference
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def lr_reference_batch(settings: SpeedSettings) -> int:
    """The batch the user's learning rate is tuned for."""
    return settings.reference_batch or (int(settings.batch_size) if settings.batch_size != "auto" else DEFAULT_REFERENCE_BATCH)


def lr_scale_choice(effective: int, settings: SpeedSettings) -> Choice[float]:
    if settings.lr_scale_rule not in ("linear", "sqrt", "none"):
        raise InputError(f"unknown lr scale rule {settings.lr_scale_rule!r}", field="lr_scale_rule", fix="use linear, sqrt or none")
    reference = lr_reference_batch(settings)
    if effective == reference:
        return Choice(1.0, f"effective batch equals the reference batch ({reference}): lr unchanged")
    if settings.lr_scale_rule == "none":
        return Choice(1.0, f"effective batch {effective} differs from reference {reference}, but lr scaling is off")
    factor = lr_scale_factor(effective, reference, settings.lr_scale_rule)
    return Choice(factor, f"{settings.lr_scale_rule} rule: effective batch {effective} / reference {reference} -> lr x {factor:.3g}")


def _arch(hardware: Hardware) -> str:
    if hardware.compute_capability is None:
        return hardware.device_type
    major, minor = hardware.compute_capability
    return f"sm_{major}{minor}"


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
