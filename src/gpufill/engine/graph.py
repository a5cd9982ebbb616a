"""A whole training step as one CUDA graph: captured once, replayed every step.

Small models are bounded by kernel launches (each 5-10 us of host time), not by their math.
Captured as a graph, a step's hundreds of kernels (forward, loss, backward, optimizer, the
epoch's loss sums) launch as one. What capture needs: every input is a static buffer filled
by copy (a batch's indices), the state lives on the device, and nothing reads the device
inside the step. A fused pack's step is built that way (`packs/pack_run.py`); so is a single
training's captured step (`step_graph.py`).

Capture follows PyTorch's recipe: a few warm-up steps on a side stream (the training's
state is put back afterwards), gradients unset, then one captured step. Any error leaves
the pack on eager steps, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

WARMUP_STEPS = 3
"""Eager steps before capture: cuBLAS handles, autograd and allocator state exist before recording."""


def capture_step(step: Callable[[], None], preserved: Callable[[], AbstractContextManager[None]], zero_grad: Callable[[], None],
                 device: torch.device) -> tuple[torch.cuda.CUDAGraph | None, str]:
    """(graph, how) for `step`, or (None, why not). `preserved()` puts the training's state back
    after the warm-up steps; the capture itself records kernels without running them."""
    if device.type != "cuda":
        return None, "eager: CUDA graphs need a CUDA device"
    inner: list[BaseException] = []  # the op that failed inside capture (capture_end then raises its own error)

    def captured() -> None:
        try:
            step()
        except Exception as error:
            inner.append(error)
            raise

    try:
        with preserved():
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            try:
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_STEPS):
                        step()
            finally:  # the state is put back on the default stream: after the side stream's last kernel
                torch.cuda.current_stream(device).wait_stream(side)
        zero_grad()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured()
        return graph, "the whole step (forward, loss, backward, optimizer, loss sums) captured once and replayed"
    except Exception as error:  # noqa: BLE001 - an op that cannot be captured: eager is always correct
        zero_grad()
        torch.cuda.synchronize(device)
        cause = inner[0] if inner else error
        return None, f"eager: the step could not be captured ({type(cause).__name__}: {str(cause).splitlines()[0][:120] if str(cause) else ''})"


