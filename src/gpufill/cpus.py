"""How many CPU cores this process may use: its affinity (taskset, Slurm's cpuset) and its cgroup's CPU quota
(a container's `--cpus=4`, Kubernetes' limits), whichever is smaller.

The quota matters because nothing else reads it: `os.cpu_count()` and torch's default thread count see every
core of the host, so a 4-CPU container on a 64-core node starts 64 intra-op threads that time-share 4 cores'
worth of time and stall at every operator's barrier. No torch import here: the instrumentation in a user's
process and the campaign's CPU budget both ask.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cpu_quota", "usable_cpus"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(root: Path = CGROUP_ROOT, cgroup_file: Path = Path("/proc/self/cgroup")) -> int:
    """Cores this process may run on: its affinity, capped by its cgroup's CPU quota (rounded up)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(root, cgroup_file)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def cpu_quota(root: Path = CGROUP_ROOT, cgroup_file: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota in cores (quota / period), the smallest on the way from this process's cgroup up to the root;
    None without one (no limit, no cgroup file system, or a layout not recognised)."""
    quotas = [q for q in (_read_quota(path) for path in _quota_files(root, cgroup_file)) if q is not None]
    return min(quotas) if quotas else None


def _quota_files(root: Path, cgroup_file: Path) -> list[Path]:
    """cgroup v2's cpu.max, or v1's cfs quota files, of this process's cgroup and each of its parents."""
    try:  # a cgroup's name is bytes to the kernel: decoded as file names are (os.fsdecode), so any name maps back to its folder
        lines = os.fsdecode(cgroup_file.read_bytes()).splitlines()
    except OSError:
        lines = []
    files = []
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":  # v2: one unified hierarchy
            files += [folder / "cpu.max" for folder in _up_from(root, path)]
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            mount = next((root / name for name in (controllers, "cpu", "cpu,cpuacct") if (root / name).is_dir()), None)
            if mount is not None:
                files += [folder / "cpu.cfs_quota_us" for folder in _up_from(mount, path)]
    return files or [root / "cpu.max", root / "cpu" / "cpu.cfs_quota_us"]


def _up_from(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its parents up to the mount (inside a container the path may not exist: the mount)."""
    parts = [part for part in path.strip("/").split("/") if part]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_quota(path: Path) -> float | None:
    """One file's quota in cores; None for no limit, and for anything not a positive quota over a positive period
    (v1 writes -1 for none; a zero, negative or unreadable value limits nothing we can trust, in v1 and v2 alike)."""
    try:
        if path.name == "cpu.max":
            quota, period = (path.read_text().split() + ["100000"])[:2]
            if quota == "max":
                return None
            quota_us, period_us = int(quota), int(period)
        else:
            quota_us = int(path.read_text().strip())
            period_us = int((path.parent / "cpu.cfs_period_us").read_text().strip())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError, OverflowError):  # ValueError: not digits, or not UTF-8; OverflowError: more cores than a float holds
        return None
