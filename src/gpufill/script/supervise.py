"""How gpufill waits for a user's command (`doctor|watch|bench -- COMMAND`) and ends it when it must.

The command runs in a process group of its own, so that gpufill can end all of it (DataLoader
workers, a launcher's ranks, whatever the script started in its group) without ending itself.
It is ended when

- it passes its deadline (`--timeout`): a doctor's or a bench's run needs only its measured steps,
  so it has one by default; a watch records a whole run, which has none unless asked;
- it runs on AFTER_STOP_S after gpufill stopped it at the end of its measured steps (a script
  that catches the stop, or whose `finally` hangs);
- gpufill passed it a SIGTERM or SIGHUP and it is still there GRACE_S later;

each time by SIGTERM to the group, then SIGKILL to the group GRACE_S later where anything of it
is left, and said in one line. Processes the command started that outlive it (a daemon that left
the group) are named, not killed: they may be wanted (a server), and they are no longer gpufill's.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufill.errors import InputError

if TYPE_CHECKING:  # imported where used: `gpufill --help` reads this module's defaults (DEADLINE_S, GRACE_S), not psutil
    import psutil

DEADLINE_S = 600.0
"""A doctor's or a bench's run: start-up (imports, data) and the warm-up and measured steps of even a large
model fit in ten minutes; a script that never reaches its steps must not hold the terminal longer."""
GRACE_S = 10.0
"""Between SIGTERM and SIGKILL: the script's own handlers and `finally` blocks (a checkpoint saved) get this long."""
AFTER_STOP_S = 30.0
"""After gpufill's stop at the end of the measured steps, the command's own ending (its `finally` blocks, a
launcher waiting for its ranks) gets this long before it is ended."""
CHECK_S = 1.0
"""How often the deadline is checked and the command's processes are listed (a scan of /proc, as the sampler's)."""
SETTLE_S = 1.0
"""Processes of the command still ending when it has ended (DataLoader workers) get this long before they are named."""


@dataclass(slots=True)
class Ending:
    """How the command ended, where gpufill ended it, and what it left running."""

    how: str = ""
    """One line; empty when the command ended by itself."""
    left_running: list[dict[str, Any]] = field(default_factory=list)
    """{"pid", "command"} of each process the command started that still runs after it."""


class Supervisor:
    """Waits for `process` (the leader of its own process group) and ends it on a deadline, a run-on past the
    measured steps, or an ignored forwarded signal. `marker` is an environment variable and value every process
    of the command inherits: what finds a daemon that left the group and was re-parented."""

    def __init__(self, process: subprocess.Popen[Any], *, marker: tuple[str, str], deadline_s: float | None, grace_s: float = GRACE_S,
                 after_stop_s: float = AFTER_STOP_S, measured: Callable[[], bool] | None = None,
                 passed_on: Callable[[], tuple[str, float] | None] = lambda: None, clock: Callable[[], float] = time.monotonic):
        self.process, self.marker, self.deadline_s, self.grace_s, self.after_stop_s = process, marker, deadline_s, grace_s, after_stop_s
        self.measured, self.passed_on, self.clock = measured, passed_on, clock
        self.started = clock()
        self.seen: dict[int, psutil.Process] = {}
        """Every process of the command seen while it ran (pid -> the process, whose start time tells a reused pid)."""
        self.stopped_at: float | None = None
        self.ending = Ending()

    def wait(self) -> int:
        """The command's exit status (as Popen gives it); `ending` says how it ended."""
        while True:
            try:
                code = self.process.wait(timeout=CHECK_S)  # returns as soon as the command ends
                break
            except subprocess.TimeoutExpired:
                pass
            now = self.clock()
            self._note_processes()
            if self.measured is not None and self.stopped_at is None and self.measured():
                self.stopped_at = now
            reason = self._reason_to_end(now)
            if reason is not None:
                code = self._end(*reason)
                break
        self.ending.left_running = self._left_running()
        return code

    def _reason_to_end(self, now: float) -> tuple[str, str | None] | None:
        """(why, the signal it ignored where gpufill passed one on) where the command must be ended now."""
        passed = self.passed_on()
        if passed is not None and now - passed[1] >= self.grace_s:
            return f"gpufill passed {passed[0]} on", passed[0]
        if self.stopped_at is not None and now - self.stopped_at >= self.after_stop_s:
            return f"the command ran on {self.after_stop_s:g} s after its measured steps", None
        if self.deadline_s is not None and now - self.started >= self.deadline_s:
            return f"the command passed its deadline of {self.deadline_s:g} s (--timeout)", None
        return None

    def _end(self, why: str, ignored: str | None) -> int:
        """SIGTERM to the group (unless one was passed on already), SIGKILL GRACE_S later to what is left of it."""
        group = self.process.pid  # the leader's pid is the group's id; it stays reserved while any member lives
        if ignored is None:
            _signal_group(group, signal.SIGTERM)
            if self._group_ends_within(self.grace_s):
                self.ending.how = f"{why}: stopped by SIGTERM"
                return self.process.wait()
        who = "the script" if self.process.poll() is None else "a process it started"
        _signal_group(group, signal.SIGKILL)
        self.ending.how = f"{why}; {who} ignored {ignored or 'SIGTERM'}: killed (SIGKILL to its process group) after {self.grace_s:g} s"
        return self.process.wait()

    def _group_ends_within(self, seconds: float) -> bool:
        """Whether the leader and every member of its group seen so far end within `seconds`."""
        until = self.clock() + seconds
        while self.clock() < until:
            if self.process.poll() is not None and not self._alive(in_group=True):
                return True
            self._note_processes()
            time.sleep(0.1)
        return False

    def _note_processes(self) -> None:
        import psutil

        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:  # it ended meanwhile
            pass

    def _alive(self, *, in_group: bool = False) -> list[psutil.Process]:
        import psutil

        alive = []
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE and (not in_group or os.getpgid(process.pid) == self.process.pid):
                    alive.append(process)
            except (psutil.Error, ProcessLookupError):
                continue
        return alive

    def _left_running(self) -> list[dict[str, Any]]:
        """The command's processes still running after it: those seen while it ran, and any that carry its marker
        (a daemon forked twice between two polls)."""
        import psutil

        name, value = self.marker
        for process in psutil.process_iter():
            if process.pid in self.seen or process.pid == os.getpid():
                continue
            try:
                if process.environ().get(name) == value:
                    self.seen[process.pid] = process
            except psutil.Error:  # another user's process, or one that ended
                continue
        until = self.clock() + SETTLE_S
        while self._alive() and self.clock() < until:
            time.sleep(0.1)
        return [{"pid": p.pid, "command": _command_line(p)} for p in sorted(self._alive(), key=lambda p: p.pid)]


def check_timeout(timeout_s: float | None, grace_s: float = GRACE_S) -> None:
    """One line (exit 2) for a deadline that is not a positive number of seconds, or a grace that is not a number of
    seconds, before anything runs."""
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError(f"--timeout {timeout_s:g} is not a positive number of seconds", where="command line", field="--timeout",
                         fix=f"e.g. --timeout {DEADLINE_S:g}")
    if not (math.isfinite(grace_s) and grace_s >= 0):
        raise InputError(f"--grace {grace_s:g} is not a number of seconds", where="command line", field="--grace", fix=f"e.g. --grace {GRACE_S:g}")


def _signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except ProcessLookupError:  # the whole group has ended
        pass


def _command_line(process: psutil.Process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return "?"


def left_running_text(left: list[dict[str, Any]]) -> list[str]:
    """One line per process the command left running."""
    return [f"still running, started by the command: pid {p['pid']}: {p['command'][:200]} (end it with: kill {p['pid']})" for p in left]
