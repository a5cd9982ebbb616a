"""What a plan builds for the hot loop: the optimizer, the precision, the forward (compiled or
not) and the step (eager, or captured as CUDA graphs).

The one place that turns a Plan into objects: the probe builds a kit per candidate it times,
the loop builds the finished plan's kit once. So what was measured is what trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpufill.engine.batches import Batches, EffectiveBatch, ResidentBatches
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.optim import make_optimizer
from gpufill.engine.plan import Plan
from gpufill.engine.precision import Precision
from gpufill.engine.step import EagerStep, Totals
from gpufill.engine.step_graph import GraphStep


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

    @property
    def step(self) -> Callable[[EffectiveBatch], Any]:
        return self.graph if self.graph is not None else self.eager

    @property
    def compiled(self) -> bool:
        return self.forward is not self.eager.model


def build_kit(model: nn.Module, plan: Plan, cfg: FitConfig, loss_fn: Callable[[Any, Any], Any], device: torch.device, *,
              scheduled: bool = False) -> Kit:
    """The plan's objects around `model` (already on `device`). `scheduled`: a schedule will change
    the learning rate, so a captured step must read it from a device tensor."""
    lr = cfg.lr * plan.lr_scale.value
    lr_on = device if plan.step_graph.value and scheduled else None
    optimizer, optimizer_choice = make_optimizer(model, cfg, lr, plan.optimizer_kernel.value, lr_on=lr_on,
                                                 captured=bool(plan.step_graph.value) and device.type == "cuda", eager=not plan.compile.value)
    precision = Precision(plan.precision.value, device, loss_scaling=plan.grad_scaler.value)
    forward: Callable[[Any], Any] = model
    compile_error = None
    if plan.compile.value:
        mode = plan.compile.value
        try:
            forward = torch.compile(model) if mode in (True, "default") else torch.compile(model, mode=mode)
        except Exception as error:  # noqa: BLE001 - any compile failure: eager is always correct
            compile_error = error
    totals = Totals(device)
    eager = EagerStep(model=model, forward=forward, loss_fn=loss_fn, optimizer=optimizer, precision=precision, totals=totals,
                      micro_batch=plan.micro_batch.value, grad_clip=cfg.grad_clip, foreach_clip=device.type == "cuda")
    return Kit(optimizer=optimizer, optimizer_choice=optimizer_choice, precision=precision, forward=forward, totals=totals, eager=eager,
               compile_error=compile_error)


def capture(kit: Kit, batches: Batches, plan: Plan) -> str:
    """Capture the plan's whole-step graphs into `kit` (after any state is loaded into its optimizer:
    replacing a state tensor would orphan the graph's copy). Raises with the reason when it cannot."""
    if not isinstance(batches, ResidentBatches):
        raise RuntimeError("a captured step needs resident data")
    graph = GraphStep(kit.eager, batches, plan.effective_batch.value)
    how = graph.capture()
    kit.graph = graph
    return how
