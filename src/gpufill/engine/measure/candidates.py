"""What the probe may measure for one training: stages of candidate values, in a fixed order.

Each stage settles one setting whose request is "auto"; its first candidate is the value the
plan holds when the stage starts (the careful hand loop's, or an earlier stage's winner), so
the plain configuration is always among the candidates. The order, and why:

1. threads (CPU): every later timing runs at the thread count the training will use;
2. precision: the largest effect on a GPU, either way (bf16 is slower for small models);
3. TF32 (fp32 on Ampere+) and cudnn.benchmark: kernel choices within the precision;
4. the optimizer kernel: torch's default against the fused one;
5. the step graph (CUDA): replaying the whole step needs the step's final kernels;
6. compile: last, and only when the training is long enough to repay its cost.

A stage whose setting was requested, or that cannot apply here, is not listed: its reason in
the plan already says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpufill.engine.config import SpeedSettings
from gpufill.engine.hardware import Hardware
from gpufill.engine.choice import Choice
from gpufill.engine.plan import Plan, grad_scaler_for, torch_default_kernel

@dataclass(frozen=True, slots=True)
class Stage:
    setting: str
    """The Plan field this stage settles."""
    candidates: tuple[Any, ...]
    """Values to time; the first is the plan's value when the stage starts."""
    costly: bool = False
    """Building a candidate costs seconds (compile): tried only when the budget leaves room for it."""


@dataclass(frozen=True, slots=True)
class Context:
    """Facts about the training that decide which stages can apply."""

    resident: bool
    """Data on the device, batched by index (what a captured step needs: static shapes and no host copies)."""
    distributed: bool
    optimizer: Literal["built-in", "factory", "pack"]
    """gpufill's own adamw/adam/sgd (its kernel can be chosen, its state captured), a user's factory
    (used as given), or a fused pack's PackAdamW (one fused update, capturable)."""
    sync_every_step: bool = False
    live: bool = False
    """A CPU training whose first steps choose its threads and precision together (`live.py`): the probe leaves both."""


def thread_counts(current: int, cores: int) -> list[int]:
    """The CPU thread counts a training chooses between: its current one first, then 1 and every core."""
    return list(dict.fromkeys([current, 1, cores]))


def stages(plan: Plan, settings: SpeedSettings, hardware: Hardware, context: Context) -> list[Stage]:
    """The stages for this plan, in the module docstring's order."""
    out: list[Stage] = []
    if settings.threads == "auto" and hardware.device_type == "cpu" and not context.live:
        counts = thread_counts(plan.threads.value, hardware.cpu_count)
        if len(counts) > 1:
            out.append(Stage("threads", tuple(counts)))
    if settings.precision == "auto" and not (hardware.device_type == "cpu" and (context.live or not settings.timed_precision)):
        low = ("bf16",) if hardware.bf16_supported else ()
        if hardware.is_cuda:
            low = (*low, "fp16")
        if low:
            out.append(Stage("precision", ("fp32", *low)))
    if settings.tf32 == "auto" and hardware.tf32_supported:
        out.append(Stage("tf32", (False, True)))
    if settings.cudnn_benchmark == "auto" and hardware.is_cuda:
        out.append(Stage("cudnn_benchmark", (False, True)))
    if settings.optimizer_kernel == "auto" and context.optimizer == "built-in":
        default = torch_default_kernel(hardware.device_type)
        if plan.optimizer_kernel.value != default:
            out.append(Stage("optimizer_kernel", (plan.optimizer_kernel.value, default)))
    if settings.cuda_graph == "auto" and hardware.is_cuda:
        out.append(Stage("step_graph", (False, True)))
    if settings.compile == "auto" and not context.distributed:
        modes = ("default", "reduce-overhead") if hardware.is_cuda else ("default",)
        out.append(Stage("compile", (False, *modes), costly=True))
    return out


def blocked(stage: Stage, plan: Plan, hardware: Hardware, context: Context) -> str | None:
    """Why `stage` cannot apply to the plan as the earlier stages left it (None: it can)."""
    if stage.setting == "step_graph":
        return graph_possible(plan, hardware, context)
    return None


def variant(plan: Plan, setting: str, value: Any, reason: str) -> Plan:
    """`plan` with `setting` = `value`, and the settings tied to it: fp16 brings its loss scaler; a
    compiled model steps without the whole-step graph (compile schedules its own)."""
    changes: dict[str, Choice[Any]] = {setting: Choice(value, reason)}
    if setting == "precision":
        changes["grad_scaler"] = grad_scaler_for(value)
    if setting == "compile" and value and plan.step_graph.value:
        changes["step_graph"] = Choice(False, f"off: the model is compiled ({reason})")
    return plan.replace(**changes)


def graph_possible(plan: Plan, hardware: Hardware, context: Context) -> str | None:
    """None when the whole step can be captured as one CUDA graph; else why not."""
    if not hardware.is_cuda:
        return "CUDA graphs need a CUDA device"
    if plan.accumulation.value > 1:
        return f"{plan.accumulation.value} micro-batches are accumulated per optimizer step"
    if plan.grad_scaler.value:
        return "fp16 loss scaling reads its overflow check on the host"
    if plan.compile.value:
        return "the model is compiled (torch.compile schedules its own graphs)"
    if not context.resident:
        return "the data is not resident on the device (a captured step reads static buffers filled on the device)"
    if context.distributed:
        return "DDP's gradient all-reduce runs its own communication streams"
    if context.optimizer == "factory":
        return "your optimizer factory's state cannot be checked for capture"
    if context.sync_every_step:
        return "the loss is read on the host every step (sync_every_step)"
    return None

