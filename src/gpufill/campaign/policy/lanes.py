"""Lanes: how many trials run at once where, and with how many threads each.

The CPU budget is explicit: GPU-lane workers each reserve one core to drive their GPU,
and the CPU lane gets the rest with slots x threads <= cores, so nothing is
oversubscribed (torch, OpenMP, MKL, OpenBLAS, XGBoost and LightGBM all get the count).

With several GPUs there is one lane per GPU (`gpu0`, `gpu1`, ...), each with its own
memory budget and its workers pinned to that GPU (CUDA_VISIBLE_DEVICES), all taking
trials from one shared `gpu` queue: a shape goes to whichever GPU frees up first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpufill.errors import InputError

LaneName = str
""""cpu", "gpu" (one GPU) or "gpu0", "gpu1", ... (one lane per GPU)."""
# A GPU worker mostly launches kernels; past this many processes per GPU the contexts
# (~300-500 MB each) and launch contention cost more than they add.
MAX_GPU_SLOTS = 16
MAX_REQUESTED_GPU_SLOTS = 64
"""gpu_slots asked for by hand: each slot is a worker process with its own CUDA context (more would only exhaust memory)."""
MAX_AUTO_THREADS = 4
"""The most threads the CPU lane gives a trial of its own accord (fewer trials than cores). Measured on 2 cores only
(one global N-BEATS: 1.18x faster at 2 threads than at 1, docs/benchmarks.md); past a few threads a small trial's
steps stall at each operator's barrier (docs/train.md), so more is left to threads_per_trial until a larger box
measures it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Lane:
    """A pool of execution slots."""

    name: LaneName
    slots: int
    threads: int
    """Threads each trial in this lane may use."""
    device: str
    """"cuda:N" or "cpu": where this lane's trials train."""
    kinds: tuple[str, ...]
    """Trial kinds ("neural", "classical") this lane runs."""
    queue: str
    """The queue this lane takes trials from: every GPU lane shares "gpu"."""
    gpu_index: int | None = None
    """With several GPUs: the one (0-based among the visible GPUs) this lane's workers are pinned to."""
    memory_budget_bytes: int | None
    """GPU lane: device memory its trials may use together (margin x total); None on CPU."""
    reason: str


def plan_lanes(
    *,
    kinds: Collection[str],
    cores: int,
    gpu_memory_bytes: int | Sequence[int] | None,
    gpu_slots: int | Literal["auto"],
    cpu_slots: int | Literal["auto"],
    threads_per_trial: int | Literal["auto"] = "auto",
    memory_margin: float = 0.85,
    where: str = "resources",
    trial_counts: Mapping[str, int] | None = None,
    cpu_threads_before: int | None = None,
) -> tuple[list[Lane], list[str]]:
    """Lanes for the trial kinds present; `gpu_memory_bytes`: one GPU's, a list (one per GPU), or None (no GPU).

    `gpu_slots` counts per GPU. `trial_counts`: the campaign file's trials per kind (None where they are not listed
    before the run: a search); a CPU lane with fewer trials than cores gives each trial the idle cores' threads.
    `cpu_threads_before`: the threads a trial this workdir's first run chose for its CPU lane (kept: the count can
    change a training's numbers). Returns (lanes, warnings).
    """
    warnings: list[str] = []
    if gpu_slots != "auto" and int(gpu_slots) > MAX_REQUESTED_GPU_SLOTS:
        raise InputError(f"gpu_slots {int(gpu_slots):,} is more than the {MAX_REQUESTED_GPU_SLOTS} gpufill allows per GPU (each slot is a worker process "
                         "with its own CUDA context)", where=where, field="resources.gpu_slots", fix=f"set gpu_slots to at most {MAX_REQUESTED_GPU_SLOTS}, or auto")
    lanes: list[Lane] = []
    memories = [] if gpu_memory_bytes is None else [gpu_memory_bytes] if isinstance(gpu_memory_bytes, int) else list(gpu_memory_bytes)
    has_gpu = bool(memories)
    neural_on_gpu = has_gpu and "neural" in kinds
    if not has_gpu and gpu_slots != "auto" and "neural" in kinds:
        warnings.append(f"gpu_slots {gpu_slots} requested but no GPU is visible: the CPU lane runs the neural trials")
    reserved = 0
    if neural_on_gpu:
        cap = max(1, min(MAX_GPU_SLOTS, cores // (2 * len(memories))))
        slots = cap if gpu_slots == "auto" else int(gpu_slots)
        share = f"{cores} cores" if len(memories) == 1 else f"{cores} cores shared by {len(memories)} GPUs"
        why = (
            f"up to {slots} at once (one core each of {share}); admitted by measured memory per shape"
            if gpu_slots == "auto"
            else f"{slots} requested; admitted by measured memory per shape"
        )
        several = len(memories) > 1
        for index, memory in enumerate(memories):
            lanes.append(
                Lane(name=f"gpu{index}" if several else "gpu", slots=slots, threads=1, device="cuda:0", kinds=("neural",), queue="gpu",
                     gpu_index=index if several else None, memory_budget_bytes=int(memory_margin * memory),
                     reason=why + (f"; pinned to GPU {index}, sharing the gpu queue" if several else ""))
            )
        total_slots = slots * len(memories)
        reserved = min(total_slots, max(cores - 1, 0)) if "classical" in kinds else total_slots
    cpu_kinds = tuple(k for k in ("neural", "classical") if k in kinds and not (k == "neural" and neural_on_gpu))
    if cpu_kinds:
        available = max(1, cores - reserved)
        trials = None if trial_counts is None else sum(trial_counts.get(kind, 0) for kind in cpu_kinds)
        slots, threads, why = _cpu_budget(available, cpu_slots, threads_per_trial, where, trials, cpu_threads_before)
        lanes.append(Lane(name="cpu", slots=slots, threads=threads, device="cpu", kinds=cpu_kinds, queue="cpu", memory_budget_bytes=None, reason=why))
    return lanes, warnings


def visible_gpu(index: int, parent_visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value that pins a worker to visible GPU `index` (respecting the parent's own list)."""
    if parent_visible:
        entries = [entry.strip() for entry in parent_visible.split(",") if entry.strip()]
        if index < len(entries):
            return entries[index]
    return str(index)


def _cpu_budget(cores: int, slots: int | Literal["auto"], threads: int | Literal["auto"], where: str, trials: int | None,
                before: int | None) -> tuple[int, int, str]:
    if slots != "auto" and int(slots) > cores:
        raise InputError(
            f"cpu_slots {slots} exceeds the {cores} cores available to the CPU lane (slots x threads must fit the cores)",
            where=where, field="resources.cpu_slots", fix=f"set cpu_slots to at most {cores}, or auto",
        )
    if threads != "auto" and int(threads) > cores:
        raise InputError(
            f"threads_per_trial {threads} exceeds the {cores} cores available to the CPU lane",
            where=where, field="resources.threads_per_trial", fix=f"set threads_per_trial to at most {cores}, or auto",
        )
    if slots == "auto" and threads == "auto":
        if before is not None:  # a trial trains at the threads the workdir's first run chose, whatever is left to run
            n_threads = max(1, min(before, cores))
            kept = "as" if n_threads == before else f"fewer than the {before}"
            return max(1, cores // n_threads), n_threads, (f"{max(1, cores // n_threads)} slots x {n_threads} thread{'s' if n_threads > 1 else ''}: "
                                                           f"{kept} this workdir's first run chose (a thread count can change a training's numbers)")
        n_threads = min(MAX_AUTO_THREADS, cores // trials) if trials else 1
        if n_threads > 1:
            return trials, n_threads, (f"{trials} slot{'s' if trials > 1 else ''} x {n_threads} threads: the campaign has {trials} "
                                       f"trial{'s' if trials > 1 else ''} for {cores} cores, so each takes cores no other trial would use "
                                       f"(at most {MAX_AUTO_THREADS})")
        # Small trials scale poorly across threads: one trial per core beats one trial on all cores.
        return cores, 1, f"{cores} slots x 1 thread: one small trial per core scales better than threads within a trial"
    if slots == "auto":
        n_threads = int(threads)
        return max(1, cores // n_threads), n_threads, f"{max(1, cores // n_threads)} slots x {n_threads} threads requested, within {cores} cores"
    n_slots = int(slots)
    n_threads = max(1, cores // n_slots) if threads == "auto" else int(threads)
    if n_slots * n_threads > cores:
        raise InputError(
            f"cpu_slots {n_slots} x threads_per_trial {n_threads} = {n_slots * n_threads} exceeds the {cores} cores",
            where=where, field="resources.threads_per_trial", fix="lower cpu_slots or threads_per_trial so their product fits the cores",
        )
    return n_slots, n_threads, f"{n_slots} slots x {n_threads} threads within {cores} cores"
