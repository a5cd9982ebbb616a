"""Lanes: how many trials run at once where, and with how many threads each.

The CPU budget is explicit: GPU-lane workers each reserve one core to drive their GPU,
and the CPU lane gets the rest with slots x threads <= cores, so nothing is
oversubscribed (torch, OpenMP, MKL, OpenBLAS, XGBoost and LightGBM all get the count).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from gpufill.errors import InputError

LaneName = Literal["gpu", "cpu"]
# A GPU worker mostly launches kernels; past this many processes per GPU the contexts
# (~300-500 MB each) and launch contention cost more than they add.
MAX_GPU_SLOTS = 16


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
    memory_budget_bytes: int | None
    """GPU lane: device memory its trials may use together (margin x total); None on CPU."""
    reason: str


def plan_lanes(
    *,
    kinds: Collection[str],
    cores: int,
    gpu_memory_bytes: int | None,
    gpu_slots: int | Literal["auto"],
    cpu_slots: int | Literal["auto"],
    threads_per_trial: int | Literal["auto"] = "auto",
    memory_margin: float = 0.85,
    where: str = "resources",
) -> tuple[list[Lane], list[str]]:
    """Lanes for the trial kinds present; `gpu_memory_bytes` None means no GPU. Returns (lanes, warnings)."""
    warnings: list[str] = []
    lanes: list[Lane] = []
    has_gpu = gpu_memory_bytes is not None
    neural_on_gpu = has_gpu and "neural" in kinds
    if not has_gpu and gpu_slots != "auto" and "neural" in kinds:
        warnings.append(f"gpu_slots {gpu_slots} requested but no GPU is visible: the CPU lane runs the neural trials")
    reserved = 0
    if neural_on_gpu:
        cap = max(1, min(MAX_GPU_SLOTS, cores // 2))
        slots = cap if gpu_slots == "auto" else int(gpu_slots)
        why = (
            f"up to {slots} at once (one core each of {cores}); admitted by measured memory per shape"
            if gpu_slots == "auto"
            else f"{slots} requested; admitted by measured memory per shape"
        )
        lanes.append(
            Lane(name="gpu", slots=slots, threads=1, device="cuda:0", kinds=("neural",),
                 memory_budget_bytes=int(memory_margin * gpu_memory_bytes), reason=why)  # type: ignore[operator]
        )
        reserved = min(slots, max(cores - 1, 0)) if "classical" in kinds else slots
    cpu_kinds = tuple(k for k in ("neural", "classical") if k in kinds and not (k == "neural" and neural_on_gpu))
    if cpu_kinds:
        available = max(1, cores - reserved)
        slots, threads, why = _cpu_budget(available, cpu_slots, threads_per_trial, where)
        lanes.append(Lane(name="cpu", slots=slots, threads=threads, device="cpu", kinds=cpu_kinds, memory_budget_bytes=None, reason=why))
    return lanes, warnings


def _cpu_budget(cores: int, slots: int | Literal["auto"], threads: int | Literal["auto"], where: str) -> tuple[int, int, str]:
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
