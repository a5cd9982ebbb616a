"""fit's set-up before the first epoch: from the data and settings to the finished plan.

Steps 1-3 of `loop.py`'s order: the plan from facts (`make_plan`) and the loader, if measured;
model and data to the device, a resumed run's weights loaded; then the probe
(`measure/resolver.py`), which returns the finished plan. `measured_plan` stops there, as
`gpufill bench` does to list what the plan turned on; `fit` goes on to train with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpufill.engine import batching, distributed, losses
from gpufill.engine.batches import ResidentBatches, signature
from gpufill.engine.checkpoint import Identity, learning_settings, model_fingerprint, optimizer_fingerprint, resume
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import Hardware, check_device, detect
from gpufill.engine.inputs import Data, Source, as_dataset, as_source, check_model, data_facts, fingerprint, harmonise_floats, make_batches
from gpufill.engine.measure import TuneCache, resolve, shape_key, tune_loader
from gpufill.engine.measure import live
from gpufill.engine.measure.candidates import Context
from gpufill.engine.measure.probe import FitProbe, probe_context
from gpufill.engine.optim import make_optimizer
from gpufill.engine.plan import Choice, Plan, make_plan
from gpufill.engine.result import Events
from gpufill.engine.streams import check_stream_ends
from gpufill.errors import InputError


def measured_plan(model: nn.Module, train: Data, val: Data | None = None, *, config: FitConfig | None = None, **overrides: Any) -> Plan:
    """The finished plan fit() would train `model` with: its probe runs (and puts the weights back); nothing is trained."""
    return prepare(model, train, val, resolve_config(config, overrides)).plan


@dataclasses.dataclass(slots=True)
class Prepared:
    """Everything set up before the first epoch: the finished plan and what it applies to."""

    cfg: FitConfig
    model: nn.Module
    plan: Plan
    device: torch.device
    loss_fn: Callable[[Any, Any], Any]
    ddp: distributed.Distributed | None
    train_source: Source
    train_batches: Any
    val_batches: Any
    resumed: tuple[dict[str, Any], dict[str, Any]] | None
    identity: Identity | None
    events: list[str]
    total_steps: int | None
    hardware: Hardware
    tune_key: str
    """The probe's cache key of this model shape, device and settings (the live trial's entry is beside it)."""


def prepare(model: nn.Module, train: Data, val: Data | None, cfg: FitConfig, listeners: Sequence[Callable[[str], None]] = ()) -> Prepared:
    """Steps 1-3 of the module docstring; `listeners` hear each event line as it is recorded."""
    if not isinstance(model, nn.Module):
        raise InputError(f"model is a {type(model).__name__}, not a torch.nn.Module", field="model",
                         fix="pass an nn.Module (a factory must return one)")
    check_model(model)
    ddp = distributed.from_environment()
    if ddp is not None and cfg.device == "auto":
        cfg = dataclasses.replace(cfg, device=ddp.device())
    check_device(cfg.device)
    check_stream_ends(train, steps_per_epoch=cfg.steps_per_epoch, max_steps=cfg.max_steps)
    if val is not None:
        check_stream_ends(val, steps_per_epoch=None, max_steps=None, name="val")
    train_source = as_source(train, "train")
    val_source = as_source(val, "val") if val is not None else None
    loss_fn, loss_choice = losses.resolve(cfg.loss)
    hardware = detect(cfg.device)
    facts = data_facts(train_source, val_source, cfg.steps_per_epoch)
    plan = make_plan(hardware, facts, cfg, epochs=cfg.epochs).replace(loss=loss_choice)
    if plan.loader_tuning.value:
        plan = plan.replace(loader=tune_loader(as_dataset(train_source), plan.effective_batch.value, hardware))
    device = torch.device(plan.device.value)
    model = model.to(device)
    events = Events(listeners)

    def batches_of(source: Source) -> Any:
        cast = harmonise_floats(source, model)
        events.extend(source.notes)
        return make_batches(source, plan, device, ddp, float_dtype=cast, steps_per_epoch=cfg.steps_per_epoch)

    train_batches = batches_of(train_source)
    val_batches = batches_of(val_source) if val_source is not None else None
    identity = resumed = None
    if cfg.checkpoint_dir is not None:  # what a checkpoint belongs to (reads a sample of the data once)
        probe_optimizer, _ = make_optimizer(model, cfg, cfg.lr, plan.optimizer_kernel.value, eager=True)  # never stepped: no torch._dynamo
        identity = Identity(model=model_fingerprint(model), optimizer=optimizer_fingerprint(probe_optimizer), data=fingerprint(train_source, cfg.data_id),
                            settings=learning_settings(cfg))
        resumed = resume(cfg.checkpoint_dir, identity, model, device, events) if cfg.resume else None
    if resumed is not None:
        plan = plan.replace(batch_search=Choice(False, "off: resumed with the checkpoint's micro-batch"))
        if (micro := int(resumed[1]["micro_batch"])) != plan.micro_batch.value:
            micro_batch, accumulation = batching.micro_batch_choices(plan.effective_batch.value, micro,
                                                                     f"{micro}: restored from the checkpoint (reduced after an out-of-memory error)")
            plan = plan.replace(micro_batch=micro_batch, accumulation=accumulation)
    context = Context(resident=isinstance(train_batches, ResidentBatches), distributed=ddp is not None,
                      optimizer="factory" if callable(cfg.optimizer) else "built-in", sync_every_step=cfg.sync_every_step,
                      live=live.applies(cfg, hardware, ddp is not None))
    per_epoch = batching.steps_per_epoch(facts, plan.effective_batch.value)
    key = shape_key("plan", model, signature(train_source.sample), hardware.name, **probe_context(cfg, plan, hardware))
    plan = resolve(plan, FitProbe(model, cfg, loss_fn, train_batches, device), settings=cfg, hardware=hardware, facts=facts, context=context,
                   total_steps=total_steps(per_epoch, cfg), cache=TuneCache(cfg.tune_cache), key=key, events=events)
    if ddp is not None:  # each rank measured alone; all follow rank 0
        plan = ddp.broadcast(plan)
    per_epoch = batching.steps_per_epoch(facts, plan.effective_batch.value)  # the batch search may have changed it
    return Prepared(cfg, model, plan, device, loss_fn, ddp, train_source, train_batches, val_batches, resumed, identity, events,
                     total_steps(per_epoch, cfg), hardware, key)


def total_steps(per_epoch: int | None, cfg: FitConfig) -> int | None:
    """The training's optimizer steps (the schedule's length): the epochs', or max_steps where it ends them first."""
    planned = per_epoch * cfg.epochs if per_epoch else None
    if cfg.max_steps is None:
        return planned
    return cfg.max_steps if planned is None else min(planned, cfg.max_steps)


def automatic_plan(train: Data, val: Data | None = None, *, config: FitConfig | None = None, **overrides: Any) -> Plan:
    """The plan fit() starts from for this data and these settings, before its measured choices
    (the probe, batch search, loader tuning) run: nothing is trained."""
    cfg = resolve_config(config, overrides)
    check_device(cfg.device)
    train_source = as_source(train, "train")
    facts = data_facts(train_source, as_source(val, "val") if val is not None else None, cfg.steps_per_epoch)
    return make_plan(detect(cfg.device), facts, cfg, epochs=cfg.epochs).replace(loss=losses.resolve(cfg.loss)[1])


def with_micro_batch(plan: Plan, micro: int, reason: str) -> Plan:
    """`plan` with another micro-batch (restored from a checkpoint, or halved after an out-of-memory error)."""
    micro_batch, accumulation = batching.micro_batch_choices(plan.effective_batch.value, micro, reason)
    return plan.replace(micro_batch=micro_batch, accumulation=accumulation)


def resolve_config(config: FitConfig | None, overrides: dict[str, Any]) -> FitConfig:
    known = {f.name for f in dataclasses.fields(FitConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InputError(f"unknown fit setting(s) {', '.join(unknown)}", field="fit", fix=f"use FitConfig fields: {', '.join(sorted(known))}")
    if config is not None and not isinstance(config, FitConfig):
        raise InputError(f"config is a {type(config).__name__}, not a FitConfig", field="config", fix="pass gpufill.FitConfig(...) or keyword settings")
    cfg = dataclasses.replace(config or FitConfig(), **overrides)
    cfg.validate()
    return cfg

