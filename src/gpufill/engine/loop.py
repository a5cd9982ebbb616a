"""`fit`: any nn.Module, any loss, any batch, trained by the one epoch loop with a Plan applied.

Order of set-up (fixed, and why):
1. the plan from facts (`make_plan`), then the loader, if measured, before any batch is built;
2. model and data to the device; a resumed run's weights loaded before the probe, so it times
   the weights training continues from;
3. the probe (`measure/resolver.py`): every auto setting timed on real steps, everything put
   back; the finished plan is final from here (under DDP: rank 0's, for every rank);
4. the plan applied once (`training.Training`, `kit.apply_plan`): backend flags and threads, a
   resumed run's RNG, the kit (optimizer and schedule, precision, compiled forward, step) built by
   the same builder the probe used, with a resumed run's optimizer, schedule and scaler state, DDP
   wrapping, and last the whole-step CUDA graph (capture records the state tensors' addresses).

The hot loop (`step.py`) never reads a device value: losses and metrics accumulate on the
device and are read once per epoch (one sync), validation every `validate_every` epochs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from torch import nn

from gpufill.engine.backend import backend_flags
from gpufill.engine.checkpoint import held_directory
from gpufill.engine.config import FitConfig
from gpufill.engine.inputs import Data
from gpufill.engine.loggers import open_loggers, parse_loggers
from gpufill.engine.prepare import automatic_plan, measured_plan, prepare, resolve_config  # noqa: F401  (automatic_plan, measured_plan: where callers find them)
from gpufill.engine.result import FitCallback, FitResult
from gpufill.engine.training import Training


def fit(
    model: nn.Module,
    train: Data,
    val: Data | None = None,
    *,
    config: FitConfig | None = None,
    callbacks: Sequence[FitCallback] = (),
    monitor: Any = None,
    loggers: Sequence[str] | str | None = None,
    **overrides: Any,
) -> FitResult:
    """Train `model` on `train`, scoring `val` (each: tensors in any structure, a Dataset, a
    DataLoader or an IterableDataset).

    Settings come from `config` with `overrides` (any FitConfig field) applied on top.
    `monitor` (a TrainingMonitor) is fed every optimizer step: its host-side time and data
    wait (on a GPU the host time is launch time: fit never syncs per step).
    `loggers`: "tensorboard:DIR" and/or "mlflow:URI" (engine/loggers.py): the plan, each
    epoch's numbers and the result written there as the training goes (rank 0 alone under DDP).
    """
    called = time.perf_counter()
    cfg = resolve_config(config, overrides)
    wanted = parse_loggers(loggers)  # a malformed one or a missing extra: refused before anything trains
    with held_directory(cfg.checkpoint_dir):  # writable, and this training's alone: checked before anything is measured or trained
        run = prepare(model, train, val, cfg, [callback.on_event for callback in callbacks])
        main = run.ddp is None or run.ddp.is_main
        writing = open_loggers(wanted) if main else []
        result: FitResult | None = None
        try:
            with backend_flags(run.plan):
                training = Training(run.model, run.cfg, run.plan, run.device, run.loss_fn, monitor, run.ddp, run.train_batches, run.resumed, run.events,
                                    total_steps=run.total_steps, hardware=run.hardware, key=run.tune_key)
                training.identity = run.identity
                result = training.train(run.train_batches, run.val_batches, [*callbacks, *writing] if main else (), run.train_source, called=called)
                return result
        finally:
            for logger in writing:
                logger.close(result)
