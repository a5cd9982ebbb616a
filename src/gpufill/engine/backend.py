"""torch's process-wide switches and device helpers: the plan's backend flags and CPU threads
(set for a training, then restored), device synchronisation for timing code, and recognising
out-of-memory errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gpufill.engine.plan import Plan


@contextlib.contextmanager
def backend_flags(plan: Plan) -> Iterator[None]:
    """Set TF32, cudnn.benchmark and the CPU threads for the training, and restore the user's values after.

    cuDNN's own TF32 switch is left as the user set it (torch's default: on): the plan's TF32 is
    the matmul switch, which torch leaves off."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    torch.backends.cuda.matmul.allow_tf32 = plan.tf32.value
    torch.backends.cudnn.benchmark = plan.cudnn_benchmark.value
    if plan.threads.value != threads:
        torch.set_num_threads(plan.threads.value)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark = saved
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where work is synchronous). Timing code only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def is_out_of_memory(error: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(error, oom_type) or (isinstance(error, RuntimeError) and "out of memory" in str(error).lower())
