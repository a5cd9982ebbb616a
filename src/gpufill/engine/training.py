"""One `fit` training as the epoch loop (engine/epochs.py) drives it: the plan applied (kit.apply_plan), its steps
with their recoveries (out of memory, a compile error), the live trial and thread watch of a CPU training,
validation, checkpoints and progress lines, and its FitResult.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpufill.engine import distributed, step
from gpufill.engine.backend import is_out_of_memory, set_threads
from gpufill.engine.checkpoint import FORMAT, Identity, TrainingState, restore_rng, rng_state, save_checkpoint, state_from, state_meta
from gpufill.engine.config import FitConfig
from gpufill.engine.inputs import Source
from gpufill.engine.hardware import Hardware
from gpufill.engine.kit import apply_plan, eager_reason
from gpufill.engine.measure import TuneCache, live
from gpufill.engine.measure.thread_watch import ThreadWatch
from gpufill.engine.plan import Choice, Plan
from gpufill.engine.progress import epoch_line, epochs_left, wants_lines
from gpufill.engine.prepare import with_micro_batch
from gpufill.engine.result import EpochRecord, FitCallback, FitResult, fit_timings, throughput
from gpufill.engine.epochs import BestWeights, Rules, Stopping, Trained, run_epochs
from gpufill.errors import InputError


def _version() -> str:
    try:
        return importlib.metadata.version("gpufill")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class Training:
    """One training run: the finished plan applied, driven by `train()`."""

    def __init__(self, model: nn.Module, cfg: FitConfig, plan: Plan, device: torch.device, loss_fn: Callable[[Any, Any], Any], monitor: Any,
                 ddp: distributed.Distributed | None, batches: Any, resumed: tuple[dict[str, Any], dict[str, Any]] | None, events: list[str], *,
                 total_steps: int | None, hardware: Hardware, key: str):
        """`key`: the plan's tune-cache key (a CPU training's live trial is cached under it)."""
        self.model, self.cfg, self.device, self.loss_fn, self.monitor, self.ddp, self.events = model, cfg, device, loss_fn, monitor, ddp, events
        self.kit, self.plan = apply_plan(model, plan, cfg, loss_fn, device, ddp=ddp, batches=batches, resumed=resumed[0] if resumed else None,
                                         total_steps=total_steps, events=events)
        # Seeded once the kit is built (a user's optimizer factory may draw random numbers; a capture puts them back).
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # dropout
        self.state = TrainingState()
        if resumed is not None:
            saved, meta = resumed
            restore_rng(saved["rng"], self.generator, device)
            self.state = state_from(meta["state"], saved.get("best_weights"))
            events.append(f"resumed after epoch {self.state.epoch} from {cfg.checkpoint_dir}")
        # Validation runs each rank's own block through the bare (or compiled) model, never the
        # DDP wrapper, whose forward is a collective every rank would have to call equally often.
        self.evaluate = self.kit.forward
        self.identity: Identity | None = None
        """What checkpoints belong to (set when checkpoint_dir is)."""
        self.timing = step.EpochTiming()
        self.first_step_done = False
        self.setup_s: float | None = None
        """Seconds from the fit call to the first epoch (set by train())."""
        self.stopping = Stopping(1, Rules.of(cfg), packed=False, events=[events])
        self.stopping.best_val, self.stopping.best_epoch, self.stopping.bad = [self.state.best_val], [self.state.best_epoch], [self.state.bad_validations]
        self.stopping.steps = [self.state.steps]
        self.best = BestWeights(model.state_dict, stacked=False, kept=self.state.best_weights)
        self.epoch_seconds: list[float] = []
        self.epoch_samples: list[int] = []
        """Each epoch's seconds and samples trained in this run (a cut last epoch: what it trained)."""
        self.watch = ThreadWatch.for_training(self.plan.threads.value, cfg, device, distributed=ddp is not None, total_steps=total_steps)
        """Re-checks the thread count when the steps drift (a CPU training with threads left to gpufill)."""
        self.watch_said = 0
        """The watch's log lines already in the events."""
        self.trial: live.LiveTrial | None = None
        """Chooses a CPU training's threads and precision on its first steps (measure/live.py); the watch waits for it.
        Where it applies (not resumed, not compiled into a graph): a cached winner at once, else the trial."""
        self.trial_key = f"{key}|live"
        if live.applies(cfg, hardware, ddp is not None) and self.state.epoch == 0 and not self.plan.step_graph.value:
            self.plan, self.trial = live.start(self.plan, cfg, hardware, total_steps=total_steps, cache=TuneCache(cfg.tune_cache),
                                               key=self.trial_key, apply=self._apply_arm)
            if self.trial is None and self.watch is not None:
                self.watch.threads = self.plan.threads.value

    def _apply_arm(self, arm: live.Arm) -> None:
        if torch.get_num_threads() != arm.threads:
            set_threads(arm.threads)
        if self.kit.precision.name != arm.precision:
            self.kit.eager.switch_precision(arm.precision)

    def _step(self, batch: Any) -> Any:
        trial = self.trial
        if trial is not None and not trial.done:
            arm = trial.needs_check()
            if arm is not None:
                planned = self.kit.eager.loss_at(batch, trial.arms[0].precision)
                try:
                    trial.precision_checked(arm.precision, planned, self.kit.eager.loss_at(batch, arm.precision))
                except Exception as error:  # noqa: BLE001 - an op without a kernel at that precision: the arm is dropped, never the training
                    trial.precision_checked(arm.precision, planned, math.nan, error=f"{type(error).__name__}: {str(error).strip()[:120]}")
            trial.before_step()
        return self.kit.step(batch)

    def _trial_finished(self, trial: live.LiveTrial) -> None:
        assert trial.winner is not None
        self.plan = live.choices(self.plan, trial.winner, trial.log)
        self.events.append(f"threads and precision: {trial.log}")
        TuneCache(self.cfg.tune_cache).put(self.trial_key, trial.record())
        if self.watch is not None:  # it watches from here: the winner's thread count, its reference the next steps' own time
            self.watch.threads = trial.winner.threads

    # -- failures of a step -------------------------------------------------------------------
    def _recover(self, error: BaseException) -> bool:
        """True when the failed step can be retried: out of memory (halve the micro-batch) or a compile error at the first step."""
        self.kit.optimizer.zero_grad(set_to_none=True)
        if is_out_of_memory(error) and self.plan.micro_batch.value > 1:
            self._recover_from_oom()
            return True
        if self.kit.compiled and not self.first_step_done and not isinstance(error, InputError):
            self._fall_back_to_eager(error)
            return True
        if not self.first_step_done and (converted := step.as_input_error(error, "train")) is not error:
            raise converted from None
        return False

    def _recover_from_oom(self) -> None:
        old = self.plan.micro_batch.value
        new = max(1, old // 2)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.plan = with_micro_batch(self.plan, new, f"{new}: halved from {old} after an out-of-memory error at epoch {self.state.epoch + 1}")
        self.kit.eager.micro_batch = new
        if self.kit.graph is not None:
            self.kit.graph = None
            self.plan = self.plan.replace(step_graph=Choice(False, "off: an out-of-memory error split the batch into micro-batches"))
        self.events.append(f"out of memory at micro-batch {old} (epoch {self.state.epoch + 1}): retried the step with micro-batch {new}, "
                           f"accumulation {self.plan.accumulation.value}")

    def _fall_back_to_eager(self, error: BaseException) -> None:
        reason = eager_reason(error)
        module = self.kit.eager.ddp_module or self.model
        self.kit.forward = self.kit.eager.forward = module
        self.evaluate = self.model
        self.plan = self.plan.replace(compile=Choice(False, reason))
        self.events.append(f"compile {reason}")

    def _stepped(self, seconds: float, samples: int, wait: float) -> None:
        self.first_step_done = True
        if self.trial is not None:  # a CPU step is done when it returns: its host time is its time
            self.trial.observe(seconds)
            if self.trial.done:  # decided after this step, or before it (its last rival dropped)
                self._trial_finished(self.trial)
                self.trial = None
        elif self.watch is not None:
            self.watch.observe(seconds)
            if len(self.watch.log) > self.watch_said:  # a re-check decided: said as it happens, among the epochs' lines
                self.events.extend(f"threads: {line}" for line in self.watch.log[self.watch_said:])
                self.watch_said = len(self.watch.log)
        if self.monitor is not None:
            self.monitor.log_iteration(seconds, samples=samples, data_wait_s=wait)

    # -- the loop: engine/epochs.py drives these -----------------------------------------------
    def train(self, train: Any, val: Any, callbacks: Sequence[FitCallback], source: Source, *, called: float | None = None) -> FitResult:
        """`called`: when fit was called (perf_counter): the set-up from there to the first epoch is reported."""
        started = time.perf_counter()
        self.setup_s = started - called if called is not None else None
        if self.setup_s is not None:  # checks, the plan, data to the device, the probe, the kit, a graph capture: all of it
            probe = self.plan.probe
            self.plan = self.plan.replace(probe=Choice(probe.value, f"{probe.reason}; set-up {self.setup_s:.2f} s from the fit call to the first "
                                                                     f"epoch, the probe's {probe.value:.2f} s included"))
        for callback in callbacks:
            callback.on_fit_start(self.plan, self.cfg.epochs)
        self.batches, self.val_batches, self.callbacks, self.source = train, val, callbacks, source
        self.has_validation = val is not None
        self.lines = wants_lines(self.cfg.verbose) and (self.ddp is None or self.ddp.is_main)
        run_epochs(self, self.stopping, [self.state.history], first=self.state.epoch + 1)
        self.stopping.restore_best(self.best)
        metrics = self.stopping.row_metrics(0, self.state.history)
        if self.watch is not None and self.watch.log:
            self.plan = self.plan.replace(threads=Choice(self.watch.threads, f"{self.watch.threads}: re-checked while training "
                                                                                f"({'; '.join(self.watch.log)})"))
        timings = fit_timings(self.epoch_seconds, self.epoch_samples, data_s=self.timing.data_s, val_s=self.timing.val_s, probe_s=self.plan.probe.value,
                              setup_s=self.setup_s, wall_s=time.perf_counter() - started)
        return FitResult(model=self.model, plan=self.plan, history=self.state.history, metrics=metrics, timings=timings,
                         events=list(self.events), status=self.stopping.status[0])  # a plain list of events: a result pickles anywhere

    def train_epoch(self, epoch: int, steps_left: Sequence[int] | None) -> Trained:
        tick = time.perf_counter()
        self.model.train()
        steps = step.train_epoch(self._step, self.batches, self.plan.effective_batch.value, self.generator, self.kit.totals,
                                 timing=self.timing, sync_every_step=self.plan.step_sync.value, on_step=self._stepped, recover=self._recover,
                                 max_steps=None if steps_left is None else steps_left[0])
        values = self.kit.totals.read(self.ddp)
        samples = self.kit.totals.samples
        seconds = time.perf_counter() - tick
        self.epoch_seconds.append(seconds)
        self.epoch_samples.append(samples)
        if self.source.n is None and epoch == self.state.epoch + 1 and self.cfg.steps_per_epoch is None:
            self.events.append(f"an epoch is {samples} samples (counted in the first epoch)")
        return Trained(values={name: [value] for name, value in values.items()}, samples=[samples], steps=[steps], seconds=seconds)

    def validate(self) -> dict[str, Sequence[float]]:
        tick = time.perf_counter()
        values = step.validate(self.evaluate, self.model, self.loss_fn, self.kit.precision, self.val_batches, self.plan.micro_batch.value,
                               self.device, self.ddp)
        self.timing.val_s += time.perf_counter() - tick
        return {name: [value] for name, value in values.items()}

    def lrs(self) -> list[float]:
        return [_lr(self.kit.optimizer)]

    def keep_best(self, rows: Sequence[int]) -> None:
        self.best.keep(rows)

    def epoch_end(self, epoch: int, records: dict[int, EpochRecord], ending: set[int]) -> dict[int, str]:
        """The epoch checkpointed (before any callback can fail), every callback told of it; unless the training ends
        here, the first callback's reason to stop prunes it."""
        stopping, record = self.stopping, records[0]
        self.state.epoch, self.state.steps = epoch, stopping.steps[0]
        self.state.best_val, self.state.best_epoch, self.state.bad_validations = stopping.best_val[0], stopping.best_epoch[0], stopping.bad[0]
        self.state.best_weights = self.best.kept
        going_on = stopping.status[0] == "completed" and not ending
        self._maybe_checkpoint(epoch, final=not going_on)
        for callback in self.callbacks:
            callback.on_epoch_end(record)
        if not going_on:
            return {}
        reason = next((found for callback in self.callbacks if (found := callback.stop(record))), None)
        return {0: reason} if reason else {}

    def after_epoch(self, epoch: int, last: bool) -> None:
        if self.lines:
            record = self.state.history[-1]
            left = epochs_left(record, self.cfg.epochs, self.cfg.max_steps, self.stopping.steps[0]) if not last else 0.0
            print(epoch_line(record, self.cfg.epochs, throughput(self.epoch_seconds, self.epoch_samples)[1], left), file=sys.stderr, flush=True)

    def _maybe_checkpoint(self, epoch: int, *, final: bool) -> None:
        if self.cfg.checkpoint_dir is None or not (final or epoch % self.cfg.checkpoint_every == 0):
            return
        if self.ddp is not None and not self.ddp.is_main:
            return  # ranks hold the same weights: rank 0 writes for all
        tensors = {
            "model": self.model.state_dict(),
            "optimizer": self.kit.optimizer.state_dict(),
            "precision": self.kit.precision.state_dict(),
            "rng": rng_state(self.generator, self.device),
            "best_weights": self.state.best_weights,
        }
        if self.kit.eager.scheduler is not None:
            tensors["schedule"] = self.kit.eager.scheduler.state_dict()
        assert self.identity is not None
        meta = {"format": FORMAT, "gpufill": _version(), "identity": dataclasses.asdict(self.identity), "state": state_meta(self.state),
                "micro_batch": self.plan.micro_batch.value, "plan": self.plan.to_dict()}
        save_checkpoint(self.cfg.checkpoint_dir, tensors, meta)


def _lr(optimizer: torch.optim.Optimizer) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
