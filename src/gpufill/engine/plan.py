"""Speed settings for one training: hardware + model + data + user settings -> Plan.

Every setting is a `Choice`: the value and the reason it was chosen. `make_plan` resolves
what facts decide, once, for the training's whole length: explicit values are checked
against the hardware and kept; an "auto" that only a measurement can settle (precision,
TF32, cudnn.benchmark, the optimizer kernel, the step graph, compile, CPU threads) starts
at the careful hand loop's setting: torch's defaults, fp32, eager, with the fused optimizer
kernel where torch has one. `measure/resolver.py` then times the candidates on real steps
and returns the finished plan; `kit.apply_plan` applies it; nothing else decides or
toggles these settings. The data and batch choices are in `batching.py`; the loss,
optimizer and schedule choices are made where those objects are built (`losses.py`,
`optim.py`) and recorded here.
"""

from __future__ import annotations

import dataclasses
import math
import os
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
from gpufill.engine.config import Auto, CompileMode, OptimizerKernel, PrecisionName, SpeedSettings
from gpufill.engine.hardware import Hardware, fused_optimizer_devices
from gpufill.errors import InputError

# The batch search times ~40 optimizer steps; below this many it would cost more than it can save.
BATCH_SEARCH_MIN_STEPS = 400
# Timing the loader candidates starts worker processes for each (seconds); worth it only
# for trainings with many batches.
LOADER_TUNING_MIN_STEPS = 200

Compile = CompileMode | bool
"""False, or the torch.compile mode: "default" or "reduce-overhead"."""

_UNSET: Choice[Any] = Choice(None, "set when training starts")


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The speed settings chosen for one training, each with its reason."""

    device: Choice[str]
    precision: Choice[PrecisionName]
    tf32: Choice[bool]
    cudnn_benchmark: Choice[bool]
    compile: Choice[Compile]
    threads: Choice[int]
    """CPU intra-op threads while the training runs (OpenMP's count, as torch.set_num_threads sets it; restored
    afterwards)."""
    host_memory: Choice[bool]
    """Freed host memory kept for the next step's tensors (glibc's malloc thresholds), not handed back to the system."""
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
    step_graph: Choice[bool]
    """The whole training step replayed as one captured CUDA graph."""
    probe: Choice[float]
    """Seconds spent measuring the candidates before the first epoch (0: none were measured)."""
    # Set by the loop when it builds them (they need the model and the training's length).
    loss: Choice[str] = _UNSET
    optimizer: Choice[str] = _UNSET
    schedule: Choice[str] = _UNSET
    pack_size: Choice[int] = Choice(1, "one model, trained alone")
    """Models trained together as one pack (fit_many, campaigns), with why."""

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


def make_plan(hardware: Hardware, data: DataFacts, settings: SpeedSettings, *, epochs: int | None = None) -> Plan:
    """Resolve every setting in a fixed order: the data's (placement, batch, loader, lr scaling) first, then the
    device's (numerics, kernels), then what pays back only over the training's length (`epochs`; None: unknown)."""
    settings.validate()
    # The data's: placement, loader, batch and lr scaling (batching.py).
    placement = batching.data_placement(hardware, data, settings)
    effective = batching.effective_batch(data, settings)
    micro = batching.micro_batch(data, effective.value, settings.micro_batch)
    per_epoch = batching.steps_per_epoch(data, effective.value)
    loader = batching.loader_settings(hardware, data, placement.value, settings.num_workers)
    tuning = batching.loader_tuning(data, placement.value, settings.num_workers)
    lr_scale = lr_scale_choice(effective.value, settings, data)
    # The device's own choices, and what pays back only over the training's length (this module).
    precision = _precision(hardware, settings.precision, timed=settings.timed_precision)
    device = Choice(hardware.device, _device_reason(hardware, settings.device))
    tf32, cudnn_benchmark = _tf32(hardware, settings.tf32), _cudnn_benchmark(hardware, settings.cudnn_benchmark)
    compile_, threads = _compile(hardware, settings.compile), _threads(hardware, settings.threads)
    optimizer_kernel, step_graph = _optimizer_kernel(hardware, settings.optimizer_kernel), _step_graph(hardware, settings.cuda_graph)
    grad_scaler = grad_scaler_for(precision.value)
    total_steps = per_epoch * epochs if per_epoch is not None and epochs is not None else None
    accumulation = math.ceil(effective.value / micro.value)
    return Plan(
        device=device, precision=precision, tf32=tf32, cudnn_benchmark=cudnn_benchmark, compile=compile_, threads=threads,
        host_memory=_host_memory(hardware), data_placement=placement, loader=loader,
        loader_tuning=_loader_tuning(tuning, total_steps),
        effective_batch=effective,
        micro_batch=micro,
        accumulation=Choice(
            accumulation,
            "1: the micro-batch is the whole effective batch"
            if accumulation == 1
            else f"{accumulation} micro-batches of {micro.value} per optimizer step keep the effective batch {effective.value}",
        ),
        lr_scale=lr_scale,
        grad_scaler=grad_scaler,
        optimizer_kernel=optimizer_kernel,
        step_sync=Choice(True, "requested: the loss is read every step (one host-device sync per step)")
        if settings.sync_every_step
        else Choice(False, "losses accumulate on the device and are read once per epoch: no sync in the hot loop"),
        batch_search=_batch_search(hardware, settings, total_steps, _unknown_length(per_epoch)),
        step_graph=step_graph,
        probe=_probe(settings.probe, total_steps, _unknown_length(per_epoch)),
    )


def grad_scaler_for(precision: str) -> Choice[bool]:
    if precision == "fp16":
        return Choice(True, "fp16 has a narrow exponent range: loss scaling keeps small gradients from flushing to zero")
    return Choice(False, f"not needed with {precision}")


def torch_default_kernel(device_type: str) -> OptimizerKernel:
    """What torch.optim picks when told nothing: multi-tensor kernels on CUDA, a per-parameter loop elsewhere."""
    return "foreach" if device_type == "cuda" else "for-loop"


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


def _precision(hardware: Hardware, requested: PrecisionName | Auto, *, timed: bool = True) -> Choice[PrecisionName]:
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
    if hardware.is_cuda:
        low = "bf16 (same exponent range as fp32)" if hardware.bf16_supported else "fp16 with loss scaling"
        return Choice("fp32", f"fp32, torch's default: {low} autocast is timed against it ({arch}); small models are often faster in fp32")
    if hardware.bf16_supported and not timed:
        return Choice("fp32", "fp32: CPU, not timed against bf16 autocast: a timed choice flips with the machine's load and would move a "
                              "campaign's numbers with it (train.precision: bf16 asks for bf16)")
    if hardware.bf16_supported:
        return Choice("fp32", "fp32: CPU, torch's default; it has bf16 instructions, so bf16 autocast is timed against it")
    return Choice("fp32", f"fp32: {hardware.device_type.upper()} without fast bf16 instructions")


def _tf32(hardware: Hardware, requested: bool | Auto) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested")
    if hardware.tf32_supported:
        return Choice(False, f"off, torch's default for matmuls: TF32 tensor cores ({_arch(hardware)}) are timed against full fp32")
    return Choice(False, "no TF32 tensor cores (needs a GPU of compute capability 8.0+)")


def _cudnn_benchmark(hardware: Hardware, requested: bool | Auto) -> Choice[bool]:
    if requested != "auto":
        return Choice(bool(requested), "requested")
    if hardware.is_cuda:
        return Choice(False, "off, torch's default: cuDNN's autotuned kernels are timed against the heuristic ones")
    return Choice(False, "no cuDNN on this device")


def _compile(hardware: Hardware, requested: bool | CompileMode | Auto) -> Choice[Compile]:
    if requested is True or requested in ("default", "reduce-overhead"):
        mode: Compile = "default" if requested is True else requested  # type: ignore[assignment]
        return Choice(mode, f"requested (mode {mode}); falls back to eager on any compile error")
    if requested is False:
        return Choice(False, "requested: off")
    return Choice(False, "eager: compiling costs seconds to minutes, so it is measured only when the training is long enough to repay it")


def _threads(hardware: Hardware, requested: int | Auto) -> Choice[int]:
    current = torch.get_num_threads()
    if requested != "auto":
        return Choice(int(requested), "requested")
    if hardware.device_type != "cpu":
        return Choice(current, f"{current}: torch's current setting (the {hardware.device_type.upper()} computes; host threads only launch work)")
    return Choice(current, f"{current}: torch's current setting; 1 thread and every core ({hardware.cpu_count}) are timed against it")


def _host_memory(hardware: Hardware) -> Choice[bool]:
    if hardware.device_type != "cpu":
        return Choice(False, f"not needed: the {hardware.device_type.upper()}'s tensors live in torch's caching allocator")
    if not _glibc():
        return Choice(False, "not set: the C library is not glibc (its malloc has other settings)")
    given = sorted(name for name in _MALLOC_VARIABLES if name in os.environ)
    if given or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        where = ", ".join(given) or "GLIBC_TUNABLES"
        return Choice(False, f"not set: glibc's malloc is configured by this process's environment ({where}), kept as given")
    return Choice(True, "freed tensors' memory kept for the next step (glibc malloc's mmap threshold 32 MiB, trim threshold "
                        "64 MiB: where its own adjustment ends up once a 32 MiB block is freed, set at the start): a CPU "
                        "step's activations reuse it instead of page-faulting fresh pages in (the character LM: ~1,160 "
                        "faults a step to 7, steps 3-25 % faster)")


_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):
        return False


def _step_graph(hardware: Hardware, requested: bool | Auto) -> Choice[bool]:
    if not hardware.is_cuda:
        return Choice(False, "off: CUDA graphs need a CUDA device")
    if requested is True:
        return Choice(True, "requested: the whole step captured once and replayed")
    if requested is False:
        return Choice(False, "off: requested")
    return Choice(False, "eager steps: replaying the whole step as one CUDA graph is timed against them")


def _unknown_length(per_epoch: int | None) -> str:
    if per_epoch is None:
        return "the training's length is unknown (an IterableDataset without steps_per_epoch)"
    return "the training's length is not given (no epochs)"


def _batch_search(hardware: Hardware, settings: SpeedSettings, total_steps: int | None, unknown: str) -> Choice[bool]:
    if settings.batch_search != "auto":
        return Choice(bool(settings.batch_search), "requested")
    if settings.micro_batch != "auto":
        return Choice(False, "off: the micro-batch is given")
    if not hardware.is_cuda:
        # Measured on this project's CPU benchmarks: micro-batches below the effective batch
        # were within noise of it, so the search would only add run-to-run variation.
        return Choice(False, "off on CPU by default: smaller micro-batches measured no faster; set batch_search=True to measure")
    if total_steps is None:
        return Choice(False, f"off: {unknown}; request it to measure")
    if total_steps < BATCH_SEARCH_MIN_STEPS:
        return Choice(False, f"off: only {total_steps} optimizer steps; measuring (~40 steps) would not pay back (needs {BATCH_SEARCH_MIN_STEPS}+)")
    return Choice(True, "measure samples/s at several micro-batch sizes and keep the fastest within the memory margin")


def _loader_tuning(planned: Choice[bool], total_steps: int | None) -> Choice[bool]:
    if planned.value and total_steps is not None and total_steps < LOADER_TUNING_MIN_STEPS:
        return Choice(False, f"off: only {total_steps} batches; timing loader settings would not pay back (needs {LOADER_TUNING_MIN_STEPS}+)")
    return planned


def _probe(requested: bool | Auto, total_steps: int | None, unknown: str) -> Choice[float]:
    if requested is False:
        return Choice(0.0, "off: requested; every auto setting keeps the careful hand loop's value, unmeasured")
    if total_steps is None:
        return Choice(0.0, f"off: {unknown}, so no budget can be set")
    return Choice(0.0, "to be measured before the first epoch")


def _arch(hardware: Hardware) -> str:
    if hardware.compute_capability is None:
        return hardware.device_type
    major, minor = hardware.compute_capability
    return f"sm_{major}{minor}"
