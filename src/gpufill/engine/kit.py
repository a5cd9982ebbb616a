"""What a plan builds for the hot loop: the forward (compiled or not), the optimizer and its
schedule, the precision and the step (eager, or captured as CUDA graphs).

The one place that turns a Plan into objects: the probe builds a kit per candidate it times
(`build_kit`), the loop applies the finished plan once (`apply_plan`: the same kit, with the
schedule, a resumed run's state, DDP and the step graph). So what was measured is what trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from gpufill.engine import distributed
from gpufill.engine.batches import Batches, EffectiveBatch
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.optim import load_optimizer_state, make_optimizer, make_schedule, resume_schedule
from gpufill.engine.plan import Plan
from gpufill.engine.precision import Precision
from gpufill.engine.step import EagerStep, Totals
from gpufill.engine.step_graph import GraphStep, capture


@dataclass(eq=False, slots=True)
class Kit:
    optimizer: torch.optim.Optimizer
    optimizer_choice: Choice[str]
    precision: Precision
    forward: Callable[[Any], Any]
    """The model as the step calls it (compiled when the plan says so)."""
    totals: Totals
    eager: EagerStep
    graph: GraphStep | None = None
    compile_error: BaseException | None = None
    """torch.compile raised while wrapping the model: the kit runs eager."""
    schedule: Choice[str] | None = None
    """The learning-rate schedule built into the step (None: the kit has none, a probe's)."""

    @property
    def step(self) -> Callable[[EffectiveBatch], Any]:
        return self.graph if self.graph is not None else self.eager

    @property
    def compiled(self) -> bool:
        return self.forward is not self.eager.model


def build_kit(model: nn.Module, plan: Plan, cfg: FitConfig, loss_fn: Callable[[Any, Any], Any], device: torch.device, *,
              total_steps: int | None | Literal[False] = False, resumed: dict[str, Any] | None = None) -> Kit:
    """The plan's objects around `model` (already on `device`). `total_steps`: the training's optimizer steps, whose
    schedule the step applies (False: no schedule, as the probe's kits have; None: a length not known). A schedule
    that changes the learning rate makes a captured step read it from a device tensor. `resumed`: a checkpoint's
    tensors, whose optimizer, schedule and loss-scaler state the kit starts from."""
    forward: Callable[[Any], Any] = model
    compile_error = None
    if plan.compile.value:
        mode = plan.compile.value
        try:
            forward = torch.compile(model) if mode in (True, "default") else torch.compile(model, mode=mode)
        except Exception as error:  # noqa: BLE001 - any compile failure: eager is always correct
            compile_error = error
    scheduled = total_steps is not False and cfg.schedule != "constant"
    lr_on = device if plan.step_graph.value and scheduled else None
    optimizer, optimizer_choice = make_optimizer(model, cfg, cfg.lr * plan.lr_scale.value, plan.optimizer_kernel.value, lr_on=lr_on,
                                                 captured=bool(plan.step_graph.value) and device.type == "cuda", eager=not plan.compile.value)
    if resumed is not None:
        load_optimizer_state(optimizer, resumed["optimizer"])
    scheduler, schedule = make_schedule(optimizer, cfg, total_steps) if total_steps is not False else (None, None)
    if scheduler is not None and resumed is not None and resumed.get("schedule") is not None:
        resume_schedule(scheduler, resumed["schedule"])
    precision = Precision(plan.precision.value, device, loss_scaling=plan.grad_scaler.value)
    if resumed is not None:
        precision.load_state_dict(resumed["precision"])
    totals = Totals(device)
    eager = EagerStep(model=model, forward=forward, loss_fn=loss_fn, optimizer=optimizer, precision=precision, totals=totals,
                      micro_batch=plan.micro_batch.value, grad_clip=cfg.grad_clip, foreach_clip=device.type == "cuda", scheduler=scheduler)
    return Kit(optimizer=optimizer, optimizer_choice=optimizer_choice, precision=precision, forward=forward, totals=totals, eager=eager,
               compile_error=compile_error, schedule=schedule)


def eager_reason(error: BaseException) -> str:
    """The plan's compile entry once compiling failed."""
    return f"off: compile failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); fell back to eager"


def apply_plan(model: nn.Module, plan: Plan, cfg: FitConfig, loss_fn: Callable[[Any, Any], Any], device: torch.device, *,
               ddp: distributed.Distributed | None, batches: Batches, resumed: dict[str, Any] | None, total_steps: int | None,
               events: list[str]) -> tuple[Kit, Plan]:
    """The finished plan applied once (step 4 of engine/loop.py): its kit with the schedule (a resumed run's: with the
    optimizer, schedule and scaler state it stopped with), DDP wrapping, and last the whole-step graph (capture records
    the state tensors' addresses). Returns the kit and the plan as applied: the optimizer and schedule built, compile
    and the step graph off with the reason where they failed."""
    kit = build_kit(model, plan, cfg, loss_fn, device, total_steps=total_steps, resumed=resumed)
    plan = plan.replace(optimizer=kit.optimizer_choice, schedule=kit.schedule)
    if kit.compile_error is not None:
        plan = plan.replace(compile=Choice(False, reason := eager_reason(kit.compile_error)))
        events.append(f"compile {reason}")
    if ddp is not None:
        module = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        kit.eager.ddp_module = module
        kit.eager.forward = torch.compile(module) if kit.compiled else module
        events.append(f"DDP: rank {ddp.rank} of {ddp.world_size} ({ddp.backend}); each rank trains on 1/{ddp.world_size} of every batch")
    if plan.step_graph.value:
        try:
            kit.graph, how = capture(kit.eager, batches, plan.effective_batch.value)
        except Exception as error:  # noqa: BLE001 - an op that cannot be captured: eager is always correct
            text = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
            plan = plan.replace(step_graph=Choice(False, f"off: the step could not be captured ({text}); eager steps"))
            how = plan.step_graph.reason
        events.append(f"step graph: {how}")
    return kit, plan
