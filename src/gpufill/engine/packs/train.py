"""Training a fused pack: K same-shape models, each on its own data, with its own lr and seed.

Each model draws the batches plain `fit` would draw for it (its own seeded permutation of
its own windows, the same batch size), so a pack reproduces K separate trainings up to
float rounding. Per model: learning rate and weight decay (a fused AdamW that takes them
as tensors: torch's optimizers take one scalar lr per group), the lr schedule over its own
steps (packs/pack_schedule.py), and the stop rules `fit` has
(engine/epochs.py: early stopping, divergence, max_steps, a pruner), a stopped model masked
while the others go on (packs/rows.py); its epochs are that loop's, as `fit`'s are.
The hot loop never reads the device: masks and losses stay on it until the epoch ends.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gpufill.engine.backend import backend_flags
from gpufill.engine.batches import signature
from gpufill.engine.config import REGRESSION_LOSSES, FitConfig
from gpufill.engine.hardware import detect
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.measure.resolver import resolve
from gpufill.engine.packs.optim import PACK_OPTIMIZERS, pack_optimizer
from gpufill.engine.packs.pack_data import Pair, PackData, padded
from gpufill.engine.packs.pack_plan import PACK_CONTEXT, PACK_OPTIMIZER_REASONS, pack_plan
from gpufill.engine.packs.pack_run import PackRun
from gpufill.engine.packs.pack_schedule import PackSchedule
from gpufill.engine.packs.probe import PackProbe, configure
from gpufill.engine.packs.reform import REFORM_MODES
from gpufill.engine.packs.rows import MemberWatch, PackRows
from gpufill.engine.packs.stacked import pack_kind, pack_module
from gpufill.engine.plan import Choice, DataFacts, make_plan
from gpufill.engine.precision import Precision
from gpufill.engine.result import EpochRecord, FitResult
from gpufill.engine.epochs import Rules, Stopping, run_epochs

PACK_LOSSES = REGRESSION_LOSSES
"""The named regression losses a pack computes per sample and masks per model."""


@dataclass(frozen=True, slots=True)
class PackMember:
    """One model of a pack: its data and its own training settings."""

    train: Pair
    val: Pair | None
    lr: float
    weight_decay: float
    seed: int
    watch: MemberWatch | None = None
    """Asked after each epoch but the last (validation data given): a reason to stop this member there (status
    "pruned": a search's pruner), or None. It stops changing, as an early-stopped member does; the others go on."""


def fit_pack(models: Sequence[nn.Module], members: Sequence[PackMember], *, config: FitConfig, kind: str | None = None,
             reform: str = "measured") -> list[FitResult]:
    """Train `models` (same class and shapes) as one fused pack of `kind` (None: the default kind,
    `packs.stacked.pack_kind`); one FitResult per model. `reform`: when members stop early, whether the pack goes on
    with its survivors alone (packs/reform.py: measured, always or never)."""
    if reform not in REFORM_MODES:
        raise ValueError(f"reform is one of {', '.join(REFORM_MODES)}, not {reform!r}")
    if not (isinstance(config.loss, str) and config.loss in PACK_LOSSES):
        raise ValueError(f"a pack trains on a regression loss ({', '.join(PACK_LOSSES)}), not {config.loss!r}: train these models one by one")
    if callable(config.schedule):
        raise ValueError("a pack runs a named schedule (constant, linear, warmup_cosine), not a function of the step: train these models one by one")
    if not (isinstance(config.optimizer, str) and config.optimizer in PACK_OPTIMIZERS):
        raise ValueError(f"a pack steps {', '.join(PACK_OPTIMIZERS)}, not optimizer {config.optimizer!r}: train these models one by one")
    k = len(models)
    counts = [int(m.train[0].shape[0]) for m in members]
    total_bytes = sum(t.numel() * t.element_size() for m in members for pair in (m.train, m.val) if pair is not None for t in pair)
    hardware = detect(config.device)
    facts = DataFacts(n_train=max(counts), bytes_total=total_bytes)
    plan = pack_plan(make_plan(hardware, facts, config, epochs=config.epochs))
    batch = plan.effective_batch.value
    device = torch.device(plan.device.value)
    kind = kind or pack_kind(models[0])
    fused = pack_module(models, kind).to(device)
    x, y = padded([m.train for m in members], device)
    val = [m.val for m in members]
    has_val = all(v is not None and v[0].shape[0] > 0 for v in val)
    vx, vy = padded(val, device) if has_val else (None, None)
    n = torch.tensor(counts, device=device)
    n_val = torch.tensor([v[0].shape[0] for v in val], device=device) if has_val else None
    lr = torch.tensor([m.lr * plan.lr_scale.value for m in members], device=device)
    optimizer = pack_optimizer(config.optimizer, list(fused.parameters()), lr, torch.tensor([m.weight_decay for m in members], device=device))
    schedule, schedule_choice = PackSchedule.of(config, [max(1, -(-count // batch)) for count in counts], device)  # each member's steps as alone
    if schedule is not None:
        optimizer.set_lr_factor(schedule.factor())  # the first step's, as LambdaLR sets it
    plan = plan.replace(optimizer=Choice(config.optimizer, PACK_OPTIMIZER_REASONS[config.optimizer]), schedule=schedule_choice)
    generators = [torch.Generator(device=device).manual_seed(m.seed) for m in members]
    torch.manual_seed(members[0].seed)  # dropout
    precision = Precision(plan.precision.value, device, loss_scaling=plan.grad_scaler.value, masked=True)
    data = PackData(x=x, y=y, n=n, counts=counts, batch=batch, vx=vx, vy=vy, n_val=n_val)
    run = PackRun(fused, optimizer, precision, config, data, device)
    run.schedule = schedule
    stopping = Stopping(k, Rules.of(config), packed=True)
    run.events, run.kind = stopping.events, kind
    requested = {name: getattr(config, name) for name in ("precision", "tf32", "cudnn_benchmark", "compile", "cuda_graph", "threads")}
    key = shape_key("pack-plan", models[0], signature((x[0, :1], y[0, :1])), hardware.name, k=k, batch=batch, loss=config.loss,
                    cores=hardware.cpu_count, threads_now=torch.get_num_threads(), torch=torch.__version__, **requested)
    events: list[str] = []
    plan = resolve(plan, PackProbe(run), settings=config, hardware=hardware, facts=facts, context=PACK_CONTEXT,
                   total_steps=run.steps_per_epoch * config.epochs, cache=TuneCache(config.tune_cache), key=key, events=events)
    with backend_flags(plan):
        plan = run.plan = configure(run, plan)
        for member_events in stopping.events:
            member_events[:0] = events
        rows = PackRows(run, generators, stopping, [m.watch for m in members], reform=reform)
        histories: list[list[EpochRecord]] = [[] for _ in range(k)]
        run_epochs(rows, stopping, histories)
        rows.finish()
        models_out = [fused.unfuse(i) for i in range(k)]
    seconds = rows.seconds
    steady = statistics.median(seconds[1:] or seconds)  # the first epoch pays warm-up
    timings = {
        "pack_size": k,
        "epoch_s": steady / k,  # this model's share of the pack's time
        "samples_per_s": sum(counts) / steady,
        "train_s": sum(seconds) / k,
        "pack_train_s": sum(seconds),
    }
    results = []
    for i in range(k):
        best_epoch = stopping.best_epoch[i]
        results.append(
            FitResult(
                model=models_out[i],
                plan=plan,
                history=histories[i],
                metrics={
                    "train_loss": histories[i][-1].train_loss if histories[i] else None,
                    "val_loss": stopping.best_val[i] if best_epoch is not None else None,
                    "best_epoch": best_epoch,
                    "epochs_run": len(histories[i]),
                },
                timings=dict(timings),
                events=stopping.events[i] + [f"trained in a pack of {k} ({kind})"],
                status=stopping.status[i],
            )
        )
    return results
