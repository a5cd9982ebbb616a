"""Workers forked from a lane's zygote (campaign/worker/zygote.py) instead of each importing torch afresh.

A worker forked from a zygote that already imported torch and the trial code starts in milliseconds instead of
seconds; the lane pays the imports once. Every zygote imports at one thread, whatever its lane's count (a BLAS pool
of more starts its threads at import, and a threaded process must not fork): a worker of a lane of several threads
takes its count after the fork (campaign/worker/worker.py). Where forking is not possible (no `os.pidfd_open`: not
Linux 5.3+; the zygote could not start, died, or refused an unsafe fork) the executor starts a fresh interpreter,
its lane's count in its environment. `GPUFILL_FRESH_WORKERS=1` always does (to compare,
or to rule the zygote out).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.connection import Connection

from gpufill.campaign.worker.early import FRESH_WORKERS_VARIABLE, spawn
from gpufill.campaign.worker.early import take as take_early
from gpufill.campaign.worker.zygote import PRELOAD

STARTUP_TIMEOUT_S = 300
"""A worker's start timed longer than this (a machine stalled) is counted as this (`worker_startup_seconds`)."""
ZYGOTE_START_TIMEOUT_S = 600.0
"""Longest wait for a zygote's first answer (its imports): past it, on a stalled machine, workers start fresh."""
FORK_TIMEOUT_S = 60.0
"""Longest wait for any later answer (a fork takes milliseconds)."""


def forks_workers() -> bool:
    """Whether lanes get a zygote here: Linux 5.3+ (pidfd), and not turned off by GPUFILL_FRESH_WORKERS=1."""
    return hasattr(os, "pidfd_open") and os.path.isdir("/proc/self/task") and os.environ.get(FRESH_WORKERS_VARIABLE) != "1"


@dataclass(eq=False)
class ForkedProcess:
    """A worker forked by a zygote: the part of `subprocess.Popen` the local executor uses (pid, wait, kill)."""

    pid: int
    zygote: Zygote
    returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code as Popen gives it; None if its zygote died first (the code went with it)."""
        if self.returncode is None:
            self.returncode = self.zygote.wait_for(self.pid, timeout)
        return self.returncode

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


@dataclass(eq=False)
class Zygote:
    """The executor's end of one lane's zygote process."""

    env: dict[str, str]
    check: tuple[str, str] | None = None
    """(request, answer) of a campaign file's grid points to build (campaign/spec/build_check.py) once imported."""
    process: subprocess.Popen | None = None
    conn: Connection | None = None
    exited: dict[int, int] = field(default_factory=dict)
    """Exit codes reported and not yet waited for, by pid."""
    answered: bool = False

    def start(self) -> None:
        """Starts the process (or adopts the one `gpufill run` started at its first line: campaign/worker/early.py); it
        imports while the other lanes' zygotes start too."""
        early = take_early(self.env)
        later: dict[str, str] = {}
        if early is not None:
            self.process, ours, later = early
        else:
            self.process, ours = spawn(self.env)
        self.conn = Connection(ours.detach())
        if later:
            self.conn.send(("env", later))
        if self.check is not None:
            self.conn.send(("check", *self.check))

    @property
    def alive(self) -> bool:
        return self.conn is not None

    def fork(self, worker_fd: int, threads: int = 1) -> ForkedProcess | None:
        """A child serving `worker_fd` (the executor keeps its own copy to close) as a worker of `threads`, or None:
        start this worker fresh."""
        if self.conn is None or self.process is None:
            return None
        try:
            self.conn.send(("fork", threads))
            reduction.send_handle(self.conn, worker_fd, self.process.pid)
            while True:
                message = self._answer(FORK_TIMEOUT_S if self.answered else ZYGOTE_START_TIMEOUT_S)
                if message is None:
                    raise TimeoutError
                self.answered = True
                if message[0] != "exited":
                    break
        except (EOFError, OSError, TimeoutError):
            self.close()
            return None
        return ForkedProcess(message[1], self) if message[0] == "forked" else None  # ("refused", why)

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited:
            if self.conn is None:
                return None
            try:
                if self._answer(None if deadline is None else max(0.0, deadline - time.monotonic())) is None:
                    raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0.0)
            except (EOFError, OSError):
                self.close()
                return None
        return self.exited.pop(pid)

    def _answer(self, timeout: float | None) -> tuple | None:
        """The zygote's next message within `timeout` seconds (None: none came); an exit it reports is kept in `exited`."""
        assert self.conn is not None
        if not self.conn.poll(timeout):
            return None
        message = self.conn.recv()
        if message[0] == "exited":
            self.exited[message[1]] = message[2]
        return message

    def close(self) -> None:
        """Ends the zygote (its EOF); forked workers live on until their own sockets close."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def worker_startup_seconds() -> float:
    """Seconds a lane takes before its first trial: an interpreter importing what a worker imports (its zygote's
    `PRELOAD`: torch, the trial code), timed in a child as the local executor starts one. Every lane starts at once
    and forks its workers, so the run pays it once; it is most of a small campaign's wall time (without it, a
    30-second campaign was estimated at 0.5x)."""
    code = "import " + ", ".join(PRELOAD)
    tick = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", code], check=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=STARTUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return float(STARTUP_TIMEOUT_S)
    return time.perf_counter() - tick
