"""torch's process-wide switches and device helpers: the plan's backend flags and CPU threads
(set for a training, then restored, through `set_threads`), its host memory setting (`keep_freed_memory`), device
synchronisation for timing code, and recognising out-of-memory errors."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch

from gpufill.engine.plan import Plan


@contextlib.contextmanager
def backend_flags(plan: Plan) -> Iterator[None]:
    """Set TF32, cudnn.benchmark and the CPU threads for the training, and restore the user's values after; keep freed
    host memory where the plan says so (for the process's life: glibc's old values cannot be read back).

    cuDNN's own TF32 switch is left as the user set it (torch's default: on): the plan's TF32 is
    the matmul switch, which torch leaves off."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    try:
        torch.backends.cuda.matmul.allow_tf32 = plan.tf32.value
        torch.backends.cudnn.benchmark = plan.cudnn_benchmark.value
        if plan.threads.value != threads:
            set_threads(plan.threads.value)
        if plan.host_memory.value:
            keep_freed_memory()
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark = saved
        if torch.get_num_threads() != threads:
            set_threads(threads)


def set_threads(threads: int) -> None:
    """This thread's CPU intra-op thread count, as `torch.set_num_threads` sets it, without its side effect on MKL.

    torch's call also pins MKL's thread count and turns MKL's dynamic adjustment off, and it keeps the count in a
    process-wide setting that every thread starting torch work later applies again (pinning MKL again). A gemm inside
    one of torch's own parallel regions (the CPU attention kernel's, per batch and head) then starts threads of its own
    on cores the region already uses. Measured on a 2-core EPYC, torch 2.13 (bench/cpu_settings.py): the character LM's
    attention forward and backward 2.4 ms before any call, 5.2 ms after `torch.set_num_threads` to 1 and back to 2, and
    still 4.4 ms with MKL put back after torch's call; 2.6 ms after this function the same way. So where torch runs on
    OpenMP the count is set where torch reads it, OpenMP's own (`omp_set_num_threads`), and MKL is left as a process
    that never called torch's function has it: dynamic, with no count of its own, so that it follows OpenMP's (never
    more threads than asked for). Elsewhere torch's own call, with MKL put back after it. Not done on the OpenMP path,
    as torch's call does: clearing oneDNN's cache of built convolutions (not exported) and resizing the pthreadpool
    XNNPACK uses."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    native = _native_threads()
    if native is not None:
        torch.get_num_threads()  # this thread's one-time set-up first: it would set the count again on first use
        native.omp_set_num_threads(threads)
    else:
        torch.set_num_threads(threads)
    mkl = _mkl()
    if mkl is None or os.environ.get("MKL_DYNAMIC", "").upper() in ("FALSE", "0"):  # MKL absent, or the user asked for this
        return
    mkl.MKL_Set_Num_Threads_Local(0)  # 0: no count of this thread's own (a no-op unless torch's call pinned one)
    mkl.MKL_Set_Dynamic(1)


def mkl_process_threads_settable() -> bool:
    """Whether `set_mkl_process_threads` can set MKL's count here (or torch has no MKL, so there is none to set)."""
    return _mkl() is None or _mkl_process_setter() is not None


def set_mkl_process_threads(threads: int) -> None:
    """MKL's process-wide thread count, as `MKL_NUM_THREADS` sets it when MKL starts: for a process whose environment
    said another count then (a campaign worker forked from its lane's zygote, which imported at one thread).
    `set_threads` leaves this count alone. A no-op where it cannot be set (`mkl_process_threads_settable`)."""
    setter = _mkl_process_setter() if _mkl() is not None else None
    if setter is not None:
        setter(threads)


@functools.cache
def _mkl_process_setter() -> Any:
    """MKL's service call behind `mkl_set_num_threads`, which torch's library exports where it does not export that
    function; None elsewhere."""
    setter = getattr(_torch_library(), "mkl_serv_set_num_threads", None)
    if setter is not None:
        setter.argtypes, setter.restype = [ctypes.c_int], None
    return setter


# glibc's mallopt parameters (malloc.h) and the values set: the largest block its own adjustment of the mmap threshold
# reaches (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), and the trim threshold it pairs with it (twice that).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES = 32 << 20, 64 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Keep freed host memory in the process for reuse (once per process; not undone: the old values cannot be read).

    By default glibc serves a block over 128 KiB with a fresh mmap, raising that threshold only up to the largest block
    freed so far, and hands the heap's free top back to the system past twice it. A CPU training step frees and
    allocates its activations (MiBs) every step, so each step page-faults fresh zeroed pages in: ~1,160 minor faults a
    step for the character LM on a 2-core EPYC, 7 with these thresholds, and its steps 3-25 % faster
    (bench/cpu_settings.py). The values are where glibc's own adjustment ends once a 32 MiB block has been freed; a
    heap's free top goes back to the system past 64 MiB (freed blocks below it stay, as always). True where set."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mapped = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        return bool(mapped) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


@functools.cache
def _torch_library() -> ctypes.CDLL | None:
    """torch's CPU library (its symbols include those of the OpenMP and MKL it was built with), or None."""
    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    except OSError:
        return None


@functools.cache
def _native_threads() -> ctypes.CDLL | None:
    """torch's CPU library where its parallel backend is OpenMP and `omp_set_num_threads` resolves through it (the
    OpenMP runtime torch itself loaded, whatever its file is called); else None."""
    library = _torch_library()
    if library is None or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        library.omp_set_num_threads.argtypes, library.omp_set_num_threads.restype = [ctypes.c_int], None
    except AttributeError:
        return None
    return library


@functools.cache
def _mkl() -> ctypes.CDLL | None:
    """MKL's C interface inside torch's CPU library, where torch was built with it (x86-64 wheels); else None."""
    library = _torch_library()
    if library is None:
        return None
    try:
        for name in ("MKL_Set_Num_Threads_Local", "MKL_Set_Dynamic"):
            getattr(library, name)
    except AttributeError:
        return None
    return library


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where work is synchronous). Timing code only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def is_out_of_memory(error: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(error, oom_type) or (isinstance(error, RuntimeError) and "out of memory" in str(error).lower())
