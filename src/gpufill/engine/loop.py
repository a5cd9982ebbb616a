"""The one training loop: any nn.Module on tensors or a Dataset, applying a Plan.

Order of application (fixed, and why):
1. backend flags (TF32, cudnn.benchmark) before anything runs, so every kernel sees them;
2. model and data to the device, then the optimizer (it must see the device parameters);
3. resume state loaded before compile, so the compiled graph wraps restored weights;
4. compile last, wrapping only the forward; the state dict stays the eager module's.

The hot loop never reads a device value: losses accumulate on the device and are read
once per epoch (one sync), validation every `validate_every` epochs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from gpufill.engine import distributed
from gpufill.engine.checkpoint import (
    TrainingState,
    capture,
    load_checkpoint,
    restore,
    save_checkpoint,
)
from gpufill.engine.batches import EffectiveBatch, LoaderBatches, ResidentBatches
from gpufill.engine.inputs import (
    Data,
    as_dataset,
    as_source,
    data_facts,
    make_batches,
    sample_input,
)
from gpufill.errors import InputError
from gpufill.engine.config import FitConfig, LOSSES
from gpufill.engine.result import EpochRecord, FitCallback, FitResult
from gpufill.engine.hardware import detect
from gpufill.engine.plan import Choice, Plan, for_training_length, make_plan
from gpufill.engine.backend import (
    autocast,
    backend_flags,
    grad_scaler,
    is_out_of_memory,
    make_optimizer,
)
from gpufill.engine.measure import MeasuredChoices, tune_loader

T = TypeVar("T")


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
    """Train `model` on `train` (an (inputs, targets) pair of tensors or a Dataset of pairs).

    Settings come from `config` with `overrides` (any FitConfig field) applied on top.
    `monitor` (a TrainingMonitor) is fed every optimizer step: its host-side time and data
    wait (on a GPU the host time is launch time: fit never syncs per step).
    """
    cfg = _resolve_config(config, overrides)
    ddp = distributed.from_environment()
    if ddp is not None and cfg.device == "auto":
        cfg = dataclasses.replace(cfg, device=ddp.device())
    train_source, val_source = as_source(train, "train"), as_source(val, "val") if val is not None else None
    hardware = detect(cfg.device)
    facts = data_facts(train_source, val_source)
    plan = make_plan(hardware, facts, cfg)
    steps = math.ceil(facts.n_train / plan.effective_batch.value) * cfg.epochs
    plan = for_training_length(plan, steps)
    device = torch.device(plan.device.value)

    if plan.loader_tuning.value:
        plan = plan.replace(loader=tune_loader(as_dataset(train_source), plan.effective_batch.value, hardware))
    if ddp is not None and cfg.compile == "auto" and plan.compile.value:
        plan = plan.replace(compile=Choice(False, "off under DDP: compile is measured per process, not across ranks; set compile=True to compile"))

    with backend_flags(plan):
        run = _Run(model.to(device), cfg, plan, device, monitor)
        train_batches = make_batches(train_source, plan, device, ddp)
        val_batches = make_batches(val_source, plan, device, ddp) if val_source is not None else None
        resumed = run.maybe_resume()
        measured = MeasuredChoices(run, train_batches, hardware, sample_input(train_source), facts.n_train, ddp)
        if not resumed:  # a resumed run keeps the checkpoint's micro-batch
            measured.search_batch()
        measured.compile()
        if ddp is not None:
            run.distribute(ddp)
        return run.train(train_batches, val_batches, callbacks if ddp is None or ddp.is_main else ())


def _resolve_config(config: FitConfig | None, overrides: dict[str, Any]) -> FitConfig:
    known = {f.name for f in dataclasses.fields(FitConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InputError(f"unknown fit setting(s) {', '.join(unknown)}", field="fit", fix=f"use FitConfig fields: {', '.join(sorted(known))}")
    cfg = dataclasses.replace(config or FitConfig(), **overrides)
    cfg.validate()
    return cfg


_State = TrainingState  # checkpoints written before TrainingState moved to _checkpoint pickled this name


class _Run:
    """One training run: model, optimizer, scaler and state, driven by `train()`."""

    def __init__(self, model: nn.Module, cfg: FitConfig, plan: Plan, device: torch.device, monitor: Any = None):
        from gpufill.monitor.training import NullMonitor

        self.model, self.cfg, self.plan, self.device = model, cfg, plan, device
        self.monitor = monitor if monitor is not None else NullMonitor()
        self.forward: Callable[[torch.Tensor], torch.Tensor] = model
        # Validation runs each rank's own block through the bare (or compiled) model, never the
        # DDP wrapper, whose forward is a collective every rank would have to call equally often.
        self.evaluate: Callable[[torch.Tensor], torch.Tensor] = model
        self.loss_fn = LOSSES[cfg.loss]
        self.lr = cfg.lr * plan.lr_scale.value
        self.optimizer = make_optimizer(model, cfg, self.lr, plan.optimizer_kernel.value)
        self.scaler = grad_scaler(device.type, plan.grad_scaler.value)
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # dropout
        self.state = TrainingState()
        self.events: list[str] = []
        self.compiled = False
        self.first_step_done = False
        self.ddp: distributed.Distributed | None = None
        self.ddp_module: nn.parallel.DistributedDataParallel | None = None
        self.timing = {"data_s": 0.0, "val_s": 0.0}

    # -- set-up -------------------------------------------------------------------------
    def maybe_resume(self) -> bool:
        """Load the last checkpoint if asked to; True when training continues from one."""
        if not self.cfg.resume:
            return False
        saved = load_checkpoint(self.cfg.checkpoint_dir, self.device)  # type: ignore[arg-type]
        if saved is None:
            self.events.append("resume: no checkpoint yet, starting from epoch 1")
            return False
        self.state, micro = restore(saved, self.model, self.optimizer, self.scaler, self.generator, self.device)
        if micro != self.plan.micro_batch.value:
            self.set_micro_batch(micro, f"{micro}: restored from the checkpoint (reduced after an out-of-memory error)")
        self.events.append(f"resumed after epoch {self.state.epoch} from {self.cfg.checkpoint_dir}")
        return True

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

    def set_lr(self, lr: float) -> None:
        self.lr = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_micro_batch(self, micro: int, reason: str) -> None:
        effective = self.plan.effective_batch.value
        accumulation = math.ceil(effective / micro)
        self.plan = self.plan.replace(
            micro_batch=Choice(micro, reason),
            accumulation=Choice(accumulation, f"{accumulation} micro-batches of {micro} keep the effective batch {effective}"),
        )

    # -- the loop -----------------------------------------------------------------------
    def train(self, train: ResidentBatches | LoaderBatches, val: ResidentBatches | LoaderBatches | None, callbacks: Sequence[FitCallback]) -> FitResult:
        status: Literal["completed", "early_stopped", "diverged"] = "completed"
        epoch_seconds: list[float] = []
        started = time.perf_counter()
        for callback in callbacks:
            callback.on_fit_start(self.plan, self.cfg.epochs)
        for epoch in range(self.state.epoch + 1, self.cfg.epochs + 1):
            tick = time.perf_counter()
            train_loss = self._train_epoch(train)
            seconds = time.perf_counter() - tick
            epoch_seconds.append(seconds)
            val_loss = None
            if val is not None and (epoch % self.cfg.validate_every == 0 or epoch == self.cfg.epochs):
                val_loss = self._validate(val)
            record = EpochRecord(epoch=epoch, train_loss=train_loss, val_loss=val_loss, seconds=seconds, lr=self.lr)
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
        return self._result(status, epoch_seconds, time.perf_counter() - started, train.n)

    def _train_epoch(self, batches: ResidentBatches | LoaderBatches) -> float:
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        seen = 0
        batch_iter = batches.epoch(self.plan.effective_batch.value, self.generator)
        while True:
            tick = time.perf_counter()
            batch = next(batch_iter, None)
            wait = time.perf_counter() - tick
            self.timing["data_s"] += wait
            if batch is None:
                break
            step_loss, weight = self._step_with_retry(batch)
            if self.plan.step_sync.value:
                step_loss.item()  # the logging loops' per-step read, kept only when asked for
            loss_sum.add_(step_loss, alpha=weight)
            seen += batch.size
            self.monitor.log_iteration(time.perf_counter() - tick, samples=batch.size, data_wait_s=wait)
        if self.ddp is not None:  # every rank must see the same loss to take the same decisions
            totals = self.ddp.sum(torch.stack([loss_sum, torch.tensor(float(seen), device=self.device)]))
            loss_sum, seen = totals[0], int(totals[1].item())
        return (loss_sum / max(seen, 1)).item()  # the epoch's one sync

    def _step_with_retry(self, batch: EffectiveBatch) -> tuple[torch.Tensor, int]:
        """One optimizer step; on OOM halve the micro-batch, double accumulation, retry the same samples."""
        while True:
            try:
                outcome = self.step(batch)
                self.first_step_done = True
                return outcome
            except Exception as error:
                self.optimizer.zero_grad(set_to_none=True)
                if is_out_of_memory(error) and self.plan.micro_batch.value > 1:
                    self._recover_from_oom(error)
                elif self.compiled and not self.first_step_done:
                    self.fall_back_to_eager(error)
                else:
                    raise

    def _recover_from_oom(self, error: BaseException) -> None:
        old = self.plan.micro_batch.value
        new = max(1, old // 2)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.set_micro_batch(new, f"{new}: halved from {old} after an out-of-memory error at epoch {self.state.epoch + 1}")
        self.events.append(f"out of memory at micro-batch {old} (epoch {self.state.epoch + 1}): retried the step with micro-batch {new}, accumulation {self.plan.accumulation.value}")

    def step(self, batch: EffectiveBatch) -> tuple[torch.Tensor, int]:
        """One optimizer step over `batch` in micro-batches; (loss, weight) with loss x weight the
        step's summed per-sample loss, on the device (the epoch adds it with one add_)."""
        micro = self.plan.micro_batch.value
        parts = batch.micro_batches(micro)
        if batch.rows <= micro:  # the usual case: one forward/backward, no accumulator
            inputs, targets = next(parts)
            loss, weight = self._forward_backward(inputs, targets, batch)
        else:
            loss, weight = torch.zeros((), device=self.device), 1
            for (inputs, targets), last in _with_last(parts):
                # Under DDP gradients are averaged across ranks once per optimizer step, not per micro-batch.
                with self.ddp_module.no_sync() if self.ddp_module is not None and not last else contextlib.nullcontext():
                    part, count = self._forward_backward(inputs, targets, batch)
                loss.add_(part, alpha=count)
        if self.cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip, foreach=self.device.type == "cuda")
        if self.plan.grad_scaler.value:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, weight

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, batch: EffectiveBatch) -> tuple[torch.Tensor, int]:
        """Forward and backward of one micro-batch; (its mean loss, detached; the samples it counts)."""
        if self.plan.autocast_dtype is None:
            prediction = self.forward(inputs)
        else:
            with autocast(self.device.type, self.plan.autocast_dtype):
                prediction = self.forward(inputs)
        if prediction.shape != targets.shape:  # host-side shape check: no sync
            raise InputError(
                f"the model returns shape {tuple(prediction.shape)} but targets have shape {tuple(targets.shape)}",
                field="model",
                fix="make the model's output match the targets (batch, horizon)",
            )
        # The loss in fp32 whatever autocast computed (the checks skip two no-op dispatches a step).
        loss = self.loss_fn(prediction if prediction.dtype == torch.float32 else prediction.float(),
                            targets if targets.dtype == torch.float32 else targets.float())
        # Weighting each micro-batch mean by its share makes k accumulated micro-batches
        # give exactly the gradient of one batch, including a short last one (and under
        # DDP, ranks whose shares differ by one give exactly the global batch's gradient).
        share = inputs.shape[0] / batch.loss_denominator
        scaled = loss if share == 1.0 else loss * share
        (self.scaler.scale(scaled) if self.plan.grad_scaler.value else scaled).backward()
        return loss.detach(), min(inputs.shape[0], batch.size)  # a stand-in sample counts 0

    @torch.no_grad()
    def _validate(self, batches: ResidentBatches | LoaderBatches) -> float:
        tick = time.perf_counter()
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)
        count = 0
        # No activations kept for backward, so validation can use larger batches.
        for inputs, targets in batches.in_order(max(4 * self.plan.micro_batch.value, 1024)):
            with autocast(self.device.type, self.plan.autocast_dtype):
                prediction = self.evaluate(inputs)
            loss_sum += self.loss_fn(prediction.float(), targets.float(), reduction="sum") / targets[0].numel()
            count += int(targets.shape[0])
        if self.ddp is not None:  # each rank scored its own block: add them up
            totals = self.ddp.sum(torch.stack([loss_sum, torch.tensor(float(count), device=self.device)]))
            loss_sum, count = totals[0], int(totals[1].item())
        value = (loss_sum / max(count, 1)).item()
        self.timing["val_s"] += time.perf_counter() - tick
        return value

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
        save_checkpoint(self.cfg.checkpoint_dir, capture(self.model, self.optimizer, self.scaler, self.generator, self.device, self.state,
                                                     self.plan.micro_batch.value))

    def _result(self, status: Literal["completed", "early_stopped", "diverged"], epoch_seconds: list[float], wall: float, n_train: int) -> FitResult:
        history = self.state.history
        # The first epoch pays warm-up (allocator, cuDNN autotune, compile): report it apart.
        steady = epoch_seconds[1:] or epoch_seconds
        epoch_s = sum(steady) / len(steady) if steady else 0.0
        train_s = sum(epoch_seconds)
        timings = {
            "samples_per_s": n_train / epoch_s if epoch_s > 0 else 0.0,
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
        return FitResult(model=self.model, plan=self.plan, history=history, metrics=metrics, timings=timings, events=self.events, status=status)


def _with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with whether it is the last (one item of look-ahead)."""
    iterator = iter(items)
    current = next(iterator, _END)
    while current is not _END:
        following = next(iterator, _END)
        yield current, following is _END
        current = following


_END: Any = object()
