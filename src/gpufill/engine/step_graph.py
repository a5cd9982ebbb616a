"""A single training's whole step as CUDA graphs: one per batch shape, replayed every step.

Resident data is batched by index, so a step's only input is its index vector: copied into a
static buffer, it feeds a captured step that gathers the batch, runs the forward, loss,
backward, gradient clipping and optimizer step, and adds the loss to the epoch's device sums.
An epoch has at most two shapes: the full batch, and a short last batch whose size is the same
every epoch (n mod batch), so each gets its own graph. That keeps any loss exact, a user's
`fn(model, batch)` included, where padding the last batch would need a per-sample mask.
Anything else (a shape never captured) steps eagerly through the same optimizer.

What capture needs of the optimizer: its state exists before recording (a lazily created
moment would be re-zeroed by every replay), so it is made first and put back to its fresh
values in place; the learning rate is a device tensor when a schedule changes it (a Python
number would be baked into the graph). Only gpufill's own AdamW/Adam/SGD are captured.
On the CPU the same static step runs eagerly (tests compare it with the eager step).
"""

from __future__ import annotations

import torch
from torch import nn

from gpufill.engine.batches import Batches, EffectiveBatch, ResidentBatches
from gpufill.engine.graph import capture_step
from gpufill.engine.snapshot import preserved_weights
from gpufill.engine.step import EagerStep


class StaticStep:
    """The step for batches of exactly `rows` samples, reading their indices from a static buffer."""

    def __init__(self, eager: EagerStep, batches: ResidentBatches, rows: int):
        self.eager, self.batches, self.rows = eager, batches, rows
        self.index = torch.zeros(rows, dtype=torch.long, device=batches.device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def body(self) -> None:
        """One optimizer step on the indexed samples (no host reads: capturable)."""
        e = self.eager
        e.optimizer.zero_grad(set_to_none=True)  # an attribute, not a kernel: in a capture, backward then writes fresh gradients
        part = self.batches.data.gather(self.index)
        with e.precision.autocast():
            values = e.loss_fn(e.forward, part)
        e.precision.backward(values["loss"])
        if e.grad_clip is not None:
            nn.utils.clip_grad_norm_(e.model.parameters(), e.grad_clip, foreach=e.foreach_clip)
        e.optimizer.step()
        e.totals.add(values, self.rows)

    def run(self, index: torch.Tensor) -> None:
        self.index.copy_(index)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.body()


class GraphStep:
    """Steps resident batches through their shape's static step (captured on a GPU); others eagerly."""

    def __init__(self, eager: EagerStep, batches: ResidentBatches, effective: int):
        self.eager = eager
        last = batches.n % effective
        self.static = {rows: StaticStep(eager, batches, rows) for rows in dict.fromkeys((min(effective, batches.n), last)) if rows}

    def capture(self) -> str:
        """Capture every shape's step (CUDA); a failure leaves none captured and raises with the reason."""
        e = self.eager
        materialize_state(e.optimizer, e.model)
        state = tuple(v for kept in e.optimizer.state.values() for v in kept.values() if isinstance(v, torch.Tensor))
        try:
            for static in self.static.values():
                graph, how = capture_step(static.body, lambda: preserved_weights(e.model, e.totals.device, extra=state),
                                          lambda: e.optimizer.zero_grad(set_to_none=True), e.totals.device)
                if graph is None:
                    for other in self.static.values():
                        other.graph = None
                    raise RuntimeError(how)
                static.graph = graph
        finally:
            e.totals.reset()  # the warm-up steps' loss sums
        shapes = " and ".join(f"{rows}" for rows in self.static)
        return f"{how}; one graph per batch shape ({shapes} samples)"

    def __call__(self, batch: EffectiveBatch) -> None:
        static = self.static.get(batch.rows)
        index = getattr(batch, "index", None)
        if static is None or index is None or batch.size != batch.rows:
            self.eager(batch)
            return
        static.run(index)
        if self.eager.scheduler is not None:
            self.eager.scheduler.step()


def capture(eager: EagerStep, batches: Batches, effective: int) -> tuple[GraphStep, str]:
    """`eager`'s step captured as whole-step graphs over `batches` (after any state is loaded into its optimizer:
    replacing a state tensor would orphan the graph's copy), and how. Raises with the reason when it cannot."""
    if not isinstance(batches, ResidentBatches):
        raise RuntimeError("a captured step needs resident data")
    graph = GraphStep(eager, batches, effective)
    return graph, graph.capture()


def materialize_state(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """Give every parameter its optimizer state now, at its fresh values (zeros: Adam's moments and
    step; SGD's momentum, whose first update from zero equals its first from none), weights unchanged."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(optimizer.state.get(p) for p in params):
        return  # resumed, or already made
    weights = [p.detach().clone() for p in params]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    with torch.no_grad():
        for p, weight, grad in zip(params, weights, grads, strict=True):
            p.copy_(weight)
            p.grad = grad
            for value in optimizer.state[p].values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
