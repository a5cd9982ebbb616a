"""FitConfig: what fit() takes, and the one home of every training default.

`SpeedSettings` is what the user asks of the speed-ups (each "auto" becomes a Choice in the
Plan); `FitConfig` adds what to learn: epochs, learning rate, loss, optimizer, schedule,
early stopping and checkpoints. `validate()` checks every field once, before anything runs,
and names the field and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufill.engine import losses
from gpufill.errors import InputError

if TYPE_CHECKING:  # torch is not needed to read the defaults (the CLI's --help does, and must stay fast)
    import torch

Auto = Literal["auto"]
PrecisionName = Literal["bf16", "fp16", "fp32"]
LrScaleRule = Literal["linear", "sqrt", "none"]
OptimizerKernel = Literal["fused", "foreach", "for-loop"]
CompileMode = Literal["default", "reduce-overhead"]
OptimizerFactory = Callable[[Iterable["torch.nn.Parameter"]], "torch.optim.Optimizer"]
ScheduleFn = Callable[[int], float]

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
COMPILE_MODES = ("default", "reduce-overhead")
PLACEMENTS = ("auto", "device", "loader")
LR_SCALE_RULES = ("linear", "sqrt", "none")
OPTIMIZER_KERNELS = ("auto", "fused", "foreach", "for-loop")
OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "warmup_cosine", "linear")
NAMED_LOSSES = tuple(losses.NAMED)
"""Every loss `fit` knows by name (the registry: engine/losses.py): help lines and messages list these."""
REGRESSION_LOSSES = tuple(losses.REGRESSION)
"""The named regression losses: a forecaster's, a pack's and a campaign file's `loss:`."""
SCALE_FREE_LOSSES = losses.SCALE_FREE


@dataclass(kw_only=True, slots=True, frozen=True)
class SpeedSettings:
    """What the user asks for; each "auto" becomes a concrete Choice in the Plan."""

    device: str = "auto"
    """"auto" (first GPU, else CPU), or a torch device string such as "cuda:1" or "cpu"."""
    precision: PrecisionName | Auto = "auto"
    """bf16 / fp16 autocast or plain fp32."""
    timed_precision: bool = True
    """Whether an "auto" precision on a CPU is timed (bf16 autocast against fp32). False: fp32 by rule, for trainings
    whose numbers must not move with the machine's load (a campaign's trials: campaign/worker/worker.py)."""
    tf32: bool | Auto = "auto"
    cudnn_benchmark: bool | Auto = "auto"
    compile: bool | CompileMode | Auto = "auto"
    """torch.compile the model: True (mode "default"), "reduce-overhead" (CUDA graphs inside), False; auto: measured."""
    cuda_graph: bool | Auto = "auto"
    """CUDA: replay the whole training step (forward, loss, backward, optimizer step) as one captured CUDA graph
    (auto: when measured faster than eager steps; needs resident data and no accumulation)."""
    threads: int | Auto = "auto"
    """CPU intra-op threads during the training (auto: measured among torch's current setting, 1 and every core)."""
    probe: bool | Auto = "auto"
    """Measure the auto settings on a few real steps before the first epoch (auto: when the training is long
    enough to repay it, within PROBE_SHARE of its expected time); False: the careful hand loop's settings, unmeasured."""
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
    """Directory caching measured choices per (model shape, device); a campaign passes its workdir. None: the directory
    the environment variable GPUFILL_TUNE_CACHE names, else this process's memory only."""

    def validate(self) -> None:
        """Every speed field checked once; the first bad one raises an InputError naming it and the fix."""
        for name in ("batch_size", "micro_batch", "num_workers"):
            value = getattr(self, name)
            if value != "auto":
                _whole(name, value, minimum=0 if name == "num_workers" else 1, auto=True)
        if self.reference_batch is not None:
            _whole("reference_batch", self.reference_batch, minimum=1, none=True)
        _number("memory_margin", self.memory_margin, "a share in (0, 1], e.g. 0.85", lambda v: 0 < v <= 1)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("data_placement", self.data_placement, PLACEMENTS)
        _one_of("lr_scale_rule", self.lr_scale_rule, LR_SCALE_RULES)
        _one_of("optimizer_kernel", self.optimizer_kernel, OPTIMIZER_KERNELS)
        for name in ("tf32", "cudnn_benchmark", "cuda_graph", "batch_search", "probe"):
            _one_of(name, getattr(self, name), (True, False, "auto"))
        _one_of("compile", self.compile, (True, False, "auto", *COMPILE_MODES))
        if self.threads != "auto":
            _whole("threads", self.threads, minimum=1, auto=True)
        if not isinstance(self.device, str) and type(self.device).__name__ != "device":  # a str or a torch.device
            raise InputError(f"device must be a string such as 'cpu' or 'cuda:0', got {type(self.device).__name__}", field="device",
                             fix="pass auto, cpu, cuda or cuda:N")


@dataclass(kw_only=True, slots=True, frozen=True)
class FitConfig(SpeedSettings):
    """Training settings (what to learn) on top of the speed settings (how fast)."""

    epochs: int = 10
    lr: float = 1e-3
    """Learning rate at the reference batch; the plan scales it with the effective batch."""
    weight_decay: float = 0.0
    """AdamW: applied to weight matrices and embeddings only, never to biases and norm weights."""
    optimizer: str | OptimizerFactory = "adamw"
    """"adamw", "adam", "sgd" (momentum 0.9), or a factory `params -> torch.optim.Optimizer`."""
    schedule: str | ScheduleFn = "constant"
    """"constant", "warmup_cosine", "linear" (warm-up, then linear decay), or `step -> lr multiplier`."""
    warmup_steps: int | Auto = "auto"
    """Warm-up of warmup_cosine and linear ("auto": 5 % of the optimizer steps)."""
    min_lr_ratio: float = 0.0
    """Where warmup_cosine and linear end, as a share of the peak learning rate."""
    loss: Any = "mse"
    """A name (mse, mae, huber, smape, mape, cross_entropy, bce_with_logits), a named loss object such as
    CrossEntropy(ignore_index=0), or `fn(model, batch) -> Tensor | {"loss": Tensor, **metrics}`."""
    grad_clip: float | None = None
    """Max global gradient norm (None: off). Opt-in: on small models it costs ~8 % of a CPU step."""
    validate_every: int = 1
    patience: int | None = None
    """Early stopping: validations without improvement before stopping; 0 or None turns early stopping off
    (stored as None: one meaning in fit, `gpufill train --patience` and a campaign's early_stopping.patience)."""
    min_delta: float = 0.0
    restore_best: bool = True
    """End with the weights of the best validation, not the last epoch (needs val data)."""
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 1
    resume: bool = False
    """Continue from checkpoint_dir's last checkpoint if there is one."""
    data_id: str | None = None
    """What names the training data in a checkpoint, where its bytes would not: computed values (a generator's,
    a feature's) differ in the last bits from one CPU to the next, so a checkpoint hashing them would not resume on
    another machine. None: a sample of the rows is hashed. Either way its size and structure must match."""
    steps_per_epoch: int | None = None
    """Optimizer steps per epoch for an IterableDataset (None: one pass, counted in the first epoch)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps in all, cutting the last epoch short (None: `epochs` decides).
    An endless stream with no steps_per_epoch trains them as one epoch."""
    verbose: bool | Auto = "auto"
    """One line per epoch on stderr (losses, samples/s, ETA); "auto": when stderr is a terminal. Nothing per step."""
    seed: int = 0
    """Seeds batch order and dropout (not the model's init, which happens before fit)."""

    def __post_init__(self) -> None:
        # Patience 0 means off, as None does: the loops then test `patience is None` only (0 would stop at once).
        if isinstance(self.patience, int) and not isinstance(self.patience, bool) and self.patience == 0:
            object.__setattr__(self, "patience", None)

    def validate(self) -> None:
        """Every field checked once; the first bad one raises an InputError naming it and the fix."""
        SpeedSettings.validate(self)
        for name in ("epochs", "validate_every", "checkpoint_every"):
            _whole(name, getattr(self, name), minimum=1)
        _whole("seed", self.seed, minimum=0)
        if self.seed >= 2**64:  # torch's generator takes 64 bits: a larger seed is an overflow deep in manual_seed
            raise InputError(f"seed {self.seed} does not fit in 64 bits", field="seed", fix="use a seed below 2**64 (any 32-bit number works everywhere)")
        _one_of("verbose", self.verbose, (True, False, "auto"))
        check_patience(self.patience)
        for name in ("steps_per_epoch", "max_steps"):
            if getattr(self, name) is not None:
                _whole(name, getattr(self, name), minimum=1, none=True)
        if self.warmup_steps != "auto":
            _whole("warmup_steps", self.warmup_steps, minimum=0, auto=True)
        _number("lr", self.lr, "a positive number such as 1e-3", lambda v: v > 0)
        _number("weight_decay", self.weight_decay, "0 or a positive number such as 0.01", lambda v: v >= 0)
        _number("min_delta", self.min_delta, "0 or a small positive number", lambda v: v >= 0)
        _number("min_lr_ratio", self.min_lr_ratio, "a share between 0 and 1, e.g. 0.1", lambda v: 0 <= v <= 1)
        if self.grad_clip is not None:
            _number("grad_clip", self.grad_clip, "a positive max norm such as 1.0, or None to turn clipping off", lambda v: v > 0)
        if not callable(self.optimizer):
            _one_of("optimizer", self.optimizer, OPTIMIZERS, also="or a factory params -> torch.optim.Optimizer")
        if not callable(self.schedule):
            _one_of("schedule", self.schedule, SCHEDULES, also="or a function step -> lr multiplier")
        if self.resume and self.checkpoint_dir is None:
            raise InputError("resume needs a checkpoint directory", field="resume", fix="set checkpoint_dir")
        if self.checkpoint_dir is not None and Path(self.checkpoint_dir).exists() and not Path(self.checkpoint_dir).is_dir():
            raise InputError(f"{str(self.checkpoint_dir)!r} is a file, not a directory", field="checkpoint_dir",
                             fix="set checkpoint_dir to a directory (it is created if missing)")


PATIENCE_OFF = "0 or None turns early stopping off"
"""What patience 0 means, in the same words in fit's, `gpufill train`'s and the campaign file's help and errors."""


def check_patience(value: Any, *, none: str = "None") -> int | None:
    """Early-stopping patience: a whole number >= 0, or None; 0 and None turn early stopping off (returned as None).
    `none`: how the caller spells None (a campaign file: null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        off = PATIENCE_OFF.replace("None", none)
        raise InputError(f"patience must be a whole number >= 0 ({off}), got {value!r}", field="patience",
                         fix="set patience to a whole number such as 5, or 0 to turn early stopping off")
    return value or None


def _whole(name: str, value: Any, *, minimum: int, auto: bool = False, none: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        other = " or auto" if auto else " or None" if none else ""
        raise InputError(f"must be a whole number >= {minimum}, got {value!r}", field=name,
                         fix=f"set {name} to an integer such as {max(minimum, 1)}{other}")


def _number(name: str, value: Any, wanted: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not ok(value):
        raise InputError(f"got {value!r}", field=name, fix=f"set {name} to {wanted}")


def _one_of(name: str, value: Any, allowed: tuple[Any, ...], also: str = "") -> None:
    if isinstance(value, bool) and True not in allowed:
        raise InputError(f"unknown {name} {value!r}", field=name, fix=f"use one of {', '.join(map(str, allowed))} {also}")
    if value not in allowed or (isinstance(value, int) and not isinstance(value, bool) and value in (0, 1) and True in allowed):
        shown = ", ".join("true" if a is True else "false" if a is False else str(a) for a in allowed)
        raise InputError(f"unknown {name} {value!r}", field=name, fix=f"use one of {shown} {also}".strip())


DEFAULTS = FitConfig()
"""Every default in one place, for the command line's options and the campaign file's fields."""
