"""A run's start-up timeline: when each step before the first result finished, in seconds since the
process started, written to the run log as "start-up: NAME at X s" lines.

A small campaign spends most of its wall time here (interpreter and imports, the data, the store,
worker processes importing torch), so the log says where it went; bench/campaign_overhead.py reads it.
"""

from __future__ import annotations

import logging
import os
import time

import psutil

log = logging.getLogger("gpufill.campaign")
_LOADED = time.time()


def process_age_s() -> float:
    """Seconds since this process was created (interpreter start-up and imports included), to the kernel's clock tick:
    its start in ticks since boot against the boot-time clock now (psutil's create_time adds a boot time rounded to
    the second: up to 1 s off)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started_ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])  # field 22, counted after the command name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        pass
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:  # a sandbox that hides /proc: count from this module's import instead
        return time.time() - _LOADED


class Timeline:
    """Marks taken before the run log exists are kept and written once it does."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []
        self.logging = False
        self.seen: set[str] = set()

    def mark(self, name: str) -> None:
        """Record `name` now; a name is marked once (the first time), so loops may call it freely."""
        if name in self.seen:
            return
        self.seen.add(name)
        self.marks.append((name, process_age_s()))
        if self.logging:
            self._write(*self.marks[-1])

    def start_logging(self) -> None:
        """The run log is open: write what was marked so far, and every later mark as it comes."""
        for name, at in self.marks:
            self._write(name, at)
        self.logging = True

    @staticmethod
    def _write(name: str, at: float) -> None:
        log.info("start-up: %s at %.2f s", name, at)
