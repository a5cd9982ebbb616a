"""The one training loop: any nn.Module, any loss, any batch, applying a Plan.

Order of application (fixed, and why):
1. backend flags (TF32, cudnn.benchmark) before anything runs, so every kernel sees them;
2. model and data to the device, then the optimizer (it must see the device parameters);
3. resume state loaded before the measured choices, so they time (and compile wraps) the
   restored weights;
4. measured choices (batch search, then compile) on the real training, everything put back;
5. DDP wrapping after them (they time one process alone); the schedule last, once the
   effective batch, and so the training's length, is final.

The hot loop (`step.py`) never reads a device value: losses and metrics accumulate on the
device and are read once per epoch (one sync), validation every `validate_every` epochs.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from gpufill.engine import batching, distributed, losses, step
from gpufill.engine.backend import backend_flags
from gpufill.engine.checkpoint import (
    FORMAT,
    Identity,
    TrainingState,
    check_identity,
    load_checkpoint,
    model_fingerprint,
    optimizer_fingerprint,
    restore_rng,
    rng_state,
    save_checkpoint,
    state_from,
    state_meta,
)
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import Hardware, check_device, detect
from gpufill.engine.inputs import Data, Source, as_dataset, as_source, data_facts, fingerprint, harmonise_floats, make_batches
from gpufill.engine.measure import MeasuredChoices, tune_loader
from gpufill.engine.optim import make_optimizer, make_schedule
from gpufill.engine.plan import Choice, Plan, for_training_length, make_plan
from gpufill.engine.precision import Precision
from gpufill.engine.result import EpochRecord, FitCallback, FitResult
from gpufill.errors import InputError

Status = Literal["completed", "early_stopped", "diverged"]


def fit(
    model: nn.Module,
    train: Data,
    val: Data | None = None,
    *,
    config: FitConfig | None = None,
    callbacks: Sequence[FitCallback] = (),
    monitor: Any = None,
    **overrides: Any,
) -> FitResult:
    """Train `model` on `train`, scoring `val` (each: tensors in any structure, a Dataset, a
    DataLoader or an IterableDataset).

    Settings come from `config` with `overrides` (any FitConfig field) applied on top.
    `monitor` (a TrainingMonitor) is fed every optimizer step: its host-side time and data
    wait (on a GPU the host time is launch time: fit never syncs per step).
    """
    cfg = _resolve_config(config, overrides)
    if not isinstance(model, nn.Module):
        raise InputError(f"model is a {type(model).__name__}, not a torch.nn.Module", field="model",
                         fix="pass an nn.Module (a factory must return one)")
    ddp = distributed.from_environment()
    if ddp is not None and cfg.device == "auto":
        cfg = dataclasses.replace(cfg, device=ddp.device())
    check_device(cfg.device)
    train_source = as_source(train, "train")
    val_source = as_source(val, "val") if val is not None else None
    loss_fn, loss_choice = losses.resolve(cfg.loss)
    hardware = detect(cfg.device)
    plan, facts = _first_plan(cfg, train_source, val_source, hardware)
    plan = plan.replace(loss=loss_choice)
    device = torch.device(plan.device.value)

    if plan.loader_tuning.value:
        plan = plan.replace(loader=tune_loader(as_dataset(train_source), plan.effective_batch.value, hardware))
    if ddp is not None and cfg.compile == "auto" and plan.compile.value:
        plan = plan.replace(compile=Choice(False, "off under DDP: compile is measured per process, not across ranks; set compile=True to compile"))

    with backend_flags(plan):
        model = model.to(device)
        training = Training(model, cfg, plan, device, loss_fn, monitor)

        def batches_of(source: Source) -> Any:
            cast = harmonise_floats(source, _float_dtype(model))
            training.events.extend(source.notes)
            return make_batches(source, plan, device, ddp, float_dtype=cast, steps_per_epoch=cfg.steps_per_epoch)

        train_batches = batches_of(train_source)
        val_batches = batches_of(val_source) if val_source is not None else None
        if cfg.checkpoint_dir is not None:  # what a checkpoint belongs to (reads a sample of the data once)
            training.identity = Identity(model=model_fingerprint(model), optimizer=optimizer_fingerprint(training.optimizer),
                                         data=fingerprint(train_source))
        resumed = training.maybe_resume()
        measured = MeasuredChoices(training, train_batches, hardware, train_source.sample, facts.n_train, ddp, largest_micro=facts.loader_batch)
        if not resumed:  # a resumed run keeps the checkpoint's micro-batch
            measured.search_batch()
        measured.compile()
        if ddp is not None:
            training.distribute(ddp)
        per_epoch = batching.steps_per_epoch(facts, training.plan.effective_batch.value)
        training.start_schedule(per_epoch * cfg.epochs if per_epoch else None)
        return training.train(train_batches, val_batches, callbacks if ddp is None or ddp.is_main else (), train_source)


def automatic_plan(train: Data, val: Data | None = None, *, config: FitConfig | None = None, **overrides: Any) -> Plan:
    """The plan fit() starts from for this data and these settings, before its measured choices
    (batch search, compile timing, loader tuning) run: nothing is trained."""
    cfg = _resolve_config(config, overrides)
    check_device(cfg.device)
    train_source = as_source(train, "train")
    plan, _facts = _first_plan(cfg, train_source, as_source(val, "val") if val is not None else None, detect(cfg.device))
    return plan.replace(loss=losses.resolve(cfg.loss)[1])


def _first_plan(cfg: FitConfig, train: Source, val: Source | None, hardware: Hardware) -> tuple[Plan, batching.DataFacts]:
    """The plan from the settings and the data's facts, with the choices that pay back only over
    enough steps (compile) settled for the training's length."""
    facts = data_facts(train, val, cfg.steps_per_epoch)
    plan = make_plan(hardware, facts, cfg)
    per_epoch = batching.steps_per_epoch(facts, plan.effective_batch.value)
    return for_training_length(plan, per_epoch * cfg.epochs if per_epoch else None), facts


def _resolve_config(config: FitConfig | None, overrides: dict[str, Any]) -> FitConfig:
    known = {f.name for f in dataclasses.fields(FitConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InputError(f"unknown fit setting(s) {', '.join(unknown)}", field="fit", fix=f"use FitConfig fields: {', '.join(sorted(known))}")
    if config is not None and not isinstance(config, FitConfig):
        raise InputError(f"config is a {type(config).__name__}, not a FitConfig", field="config", fix="pass gpufill.FitConfig(...) or keyword settings")
    cfg = dataclasses.replace(config or FitConfig(), **overrides)
    cfg.validate()
    return cfg


def _version() -> str:
    try:
        return importlib.metadata.version("gpufill")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def _float_dtype(model: nn.Module) -> torch.dtype | None:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


class _NullMonitor:
    def log_iteration(self, seconds: float, *, samples: int = 0, data_wait_s: float = 0.0) -> None:
        """Nothing: fit feeds a monitor only when given one."""


class Training:
    """One training run: model, optimizer, precision, schedule and state, driven by `train()`."""

    def __init__(self, model: nn.Module, cfg: FitConfig, plan: Plan, device: torch.device, loss_fn: Callable[[Any, Any], Any], monitor: Any = None):
        self.model, self.cfg, self.plan, self.device, self.loss_fn = model, cfg, plan, device, loss_fn
        self.monitor = monitor if monitor is not None else _NullMonitor()
        self.forward: Callable[[Any], Any] = model
        # Validation runs each rank's own block through the bare (or compiled) model, never the
        # DDP wrapper, whose forward is a collective every rank would have to call equally often.
        self.evaluate: Callable[[Any], Any] = model
        self.optimizer, optimizer_choice = make_optimizer(model, cfg, cfg.lr * plan.lr_scale.value, plan.optimizer_kernel.value)
        self.plan = plan.replace(optimizer=optimizer_choice)
        self.precision = Precision(plan.precision.value, device, loss_scaling=plan.grad_scaler.value)
        self.scheduler: Any = None
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # dropout
        self.state = TrainingState()
        self.events: list[str] = []
        self.compiled = False
        self.first_step_done = False
        self.ddp: distributed.Distributed | None = None
        self.ddp_module: nn.parallel.DistributedDataParallel | None = None
        self.timing = {"data_s": 0.0, "val_s": 0.0}
        self._saved_schedule: dict[str, Any] | None = None
        self.identity: Identity | None = None
        """What checkpoints belong to (set when checkpoint_dir is)."""

    # -- set-up -------------------------------------------------------------------------
    def maybe_resume(self) -> bool:
        """Load the last checkpoint if asked to; True when training continues from one."""
        if not self.cfg.resume:
            return False
        loaded = load_checkpoint(self.cfg.checkpoint_dir, self.device)  # type: ignore[arg-type]
        if loaded is None:
            self.events.append("resume: no checkpoint yet, starting from epoch 1")
            return False
        saved, meta = loaded
        assert self.identity is not None
        check_identity(meta, self.identity, self.cfg.checkpoint_dir)  # type: ignore[arg-type]
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.precision.load_state_dict(saved["precision"])
        restore_rng(saved["rng"], self.generator, self.device)
        self._saved_schedule = saved.get("schedule")
        self.state = state_from(meta["state"], saved.get("best_weights"))
        micro = int(meta["micro_batch"])
        if micro != self.plan.micro_batch.value:
            self.set_micro_batch(micro, f"{micro}: restored from the checkpoint (reduced after an out-of-memory error)")
        self.events.append(f"resumed after epoch {self.state.epoch} from {self.cfg.checkpoint_dir}")
        return True

    def start_schedule(self, total_steps: int | None) -> None:
        self.scheduler, choice = make_schedule(self.optimizer, self.cfg, total_steps)
        self.plan = self.plan.replace(schedule=choice)
        if self.scheduler is not None and self._saved_schedule is not None:
            self.scheduler.load_state_dict(self._saved_schedule)
            # LambdaLR's constructor set each group's lr for step 0 and load_state_dict does not
            # undo it: put back the lr the interrupted run would take its next step with.
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
                group["lr"] = lr

    def use_compiled(self, reason: str | None = None) -> None:
        """Wrap the forward with torch.compile (compiles lazily, at the first call)."""
        try:
            self.forward = self.evaluate = torch.compile(self.model)
            self.compiled = True
        except Exception as error:  # any compile failure: eager is always correct
            self.fall_back_to_eager(error)
            return
        if reason is not None:
            self.plan = self.plan.replace(compile=Choice(True, reason))

    def distribute(self, ddp: distributed.Distributed) -> None:
        """Wrap the model in DDP (after the measured choices, which time one process alone)."""
        self.ddp = ddp
        self.ddp_module = nn.parallel.DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.forward = torch.compile(self.ddp_module) if self.compiled else self.ddp_module
        self.events.append(f"DDP: rank {ddp.rank} of {ddp.world_size} ({ddp.backend}); each rank trains on 1/{ddp.world_size} of every batch")

    def use_eager(self, choice: Choice[bool]) -> None:
        self.forward, self.evaluate, self.compiled = self.model, self.model, False
        self.plan = self.plan.replace(compile=choice)

    def fall_back_to_eager(self, error: BaseException) -> None:
        reason = f"off: compile failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); fell back to eager"
        self.use_eager(Choice(False, reason))
        self.events.append(f"compile {reason}")

    def rescale_lr(self, factor: float) -> None:
        """Every group's learning rate times `factor` (the batch search changed the effective batch)."""
        for group in self.optimizer.param_groups:
            group["lr"] *= factor

    def set_micro_batch(self, micro: int, reason: str) -> None:
        effective = self.plan.effective_batch.value
        accumulation = math.ceil(effective / micro)
        self.plan = self.plan.replace(
            micro_batch=Choice(micro, reason),
            accumulation=Choice(accumulation, f"{accumulation} micro-batches of {micro} keep the effective batch {effective}"),
        )

    def recover_from_oom(self) -> None:
        old = self.plan.micro_batch.value
        new = max(1, old // 2)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.set_micro_batch(new, f"{new}: halved from {old} after an out-of-memory error at epoch {self.state.epoch + 1}")
        self.events.append(f"out of memory at micro-batch {old} (epoch {self.state.epoch + 1}): retried the step with micro-batch {new}, "
                           f"accumulation {self.plan.accumulation.value}")

    def step(self, batch: Any) -> Any:
        """One optimizer step (the measured choices time these)."""
        return step.optimizer_step(self, batch)

    # -- the loop -----------------------------------------------------------------------
    def train(self, train: Any, val: Any, callbacks: Sequence[FitCallback], source: Source) -> FitResult:
        status: Status = "completed"
        epoch_seconds: list[float] = []
        samples_per_epoch = 0
        started = time.perf_counter()
        for callback in callbacks:
            callback.on_fit_start(self.plan, self.cfg.epochs)
        for epoch in range(self.state.epoch + 1, self.cfg.epochs + 1):
            tick = time.perf_counter()
            train_values, samples_per_epoch = step.train_epoch(self, train)
            seconds = time.perf_counter() - tick
            epoch_seconds.append(seconds)
            if source.n is None and epoch == self.state.epoch + 1 and self.cfg.steps_per_epoch is None:
                self.events.append(f"an epoch is {samples_per_epoch} samples (counted in the first epoch)")
            val_values = None
            if val is not None and (epoch % self.cfg.validate_every == 0 or epoch == self.cfg.epochs):
                val_values = step.validate(self, val)
            train_loss = train_values.pop("loss")
            val_loss = val_values.pop("loss") if val_values is not None else None
            record = EpochRecord(epoch=epoch, train_loss=train_loss, val_loss=val_loss, seconds=seconds, lr=self.optimizer.param_groups[0]["lr"],
                                 train_metrics=train_values, val_metrics=val_values)
            self.state.history.append(record)
            self.state.epoch = epoch
            if not math.isfinite(train_loss) or (val_loss is not None and not math.isfinite(val_loss)):
                status = "diverged"
                self.events.append(f"diverged at epoch {epoch}: loss is {train_loss if not math.isfinite(train_loss) else val_loss}")
            elif val_loss is not None and self._early_stop(val_loss, epoch):
                status = "early_stopped"
                self.events.append(f"early stop at epoch {epoch}: no improvement for {self.cfg.patience} validations")
            self._maybe_checkpoint(epoch, final=status != "completed" or epoch == self.cfg.epochs)
            for callback in callbacks:
                callback.on_epoch_end(record)
            if status != "completed":
                break
        if self.cfg.restore_best and self.state.best_weights is not None and status != "diverged":
            self.model.load_state_dict(self.state.best_weights)
            self.events.append(f"restored the best weights (epoch {self.state.best_epoch}, val loss {self.state.best_val:.6g})")
        return self._result(status, epoch_seconds, time.perf_counter() - started, samples_per_epoch)

    def _early_stop(self, val_loss: float, epoch: int) -> bool:
        if val_loss < self.state.best_val - self.cfg.min_delta:
            self.state.best_val, self.state.best_epoch, self.state.bad_validations = val_loss, epoch, 0
            self.state.best_weights = {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}
            return False
        self.state.bad_validations += 1
        return self.cfg.patience is not None and self.state.bad_validations >= self.cfg.patience

    def _maybe_checkpoint(self, epoch: int, *, final: bool) -> None:
        if self.cfg.checkpoint_dir is None or not (final or epoch % self.cfg.checkpoint_every == 0):
            return
        if self.ddp is not None and not self.ddp.is_main:
            return  # ranks hold the same weights: rank 0 writes for all
        tensors = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
            "rng": rng_state(self.generator, self.device),
            "best_weights": self.state.best_weights,
        }
        if self.scheduler is not None:
            tensors["schedule"] = self.scheduler.state_dict()
        assert self.identity is not None
        meta = {"format": FORMAT, "gpufill": _version(), "identity": dataclasses.asdict(self.identity), "state": state_meta(self.state),
                "micro_batch": self.plan.micro_batch.value, "plan": self.plan.to_dict()}
        save_checkpoint(self.cfg.checkpoint_dir, tensors, meta)

    def _result(self, status: Status, epoch_seconds: list[float], wall: float, samples_per_epoch: int) -> FitResult:
        history = self.state.history
        # The first epoch pays warm-up (allocator, cuDNN autotune, compile): report it apart.
        steady = epoch_seconds[1:] or epoch_seconds
        epoch_s = sum(steady) / len(steady) if steady else 0.0
        train_s = sum(epoch_seconds)
        timings = {
            "samples_per_s": samples_per_epoch / epoch_s if epoch_s > 0 else 0.0,
            "epoch_s": epoch_s,
            "first_epoch_s": epoch_seconds[0] if epoch_seconds else 0.0,
            "train_s": train_s,
            "val_s": self.timing["val_s"],
            "data_s": self.timing["data_s"],
            "compute_s": max(0.0, train_s - self.timing["data_s"]),
            "wall_s": wall,
        }
        metrics: dict[str, float | int | None] = {
            "train_loss": history[-1].train_loss if history else None,
            "val_loss": self.state.best_val if self.state.best_epoch is not None else None,
            "best_epoch": self.state.best_epoch,
            "epochs_run": len(history),
        }
        if history:
            metrics.update({f"train_{name}": value for name, value in history[-1].train_metrics.items()})
            best = next((r for r in history if r.epoch == self.state.best_epoch), None)
            scored = best or next((r for r in reversed(history) if r.val_metrics is not None), None)
            if scored is not None and scored.val_metrics:
                metrics.update({f"val_{name}": value for name, value in scored.val_metrics.items()})
        return FitResult(model=self.model, plan=self.plan, history=history, metrics=metrics, timings=timings, events=self.events, status=status)
