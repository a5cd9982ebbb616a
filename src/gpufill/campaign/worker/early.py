"""A zygote started in the first milliseconds of `gpufill run` / `gpufill demo`, before the command line's own imports.

A small campaign's wall time is mostly torch's import in the lane's zygote (campaign/worker/zygote.py). Started
when the lanes are planned, that import began ~0.4 s into the process (the command line, pydantic, the campaign file
come first); a user's own script starts importing torch at once. Here the zygote starts before any of that, with
the environment every lane's zygote has (one thread in every pool: a worker of several threads takes its count after
the fork), and the local executor adopts it for its first lane (`take`): its GPU is told to it before it forks
anything (`CUDA_VISIBLE_DEVICES` is read when a child first uses CUDA, not at import). Where no lane takes it (another
executor, an environment that differs in what is read at import, a run refused for bad input) it is stopped at once
or at exit.

Only the standard library here: this module runs before everything else.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
from contextlib import suppress
from dataclasses import dataclass

COMMANDS = ("run", "demo")
"""The commands that train (locally, by default) and so start a zygote early."""
VARIABLE = "GPUFILL_EARLY_ZYGOTE"
"""Set to 0 to start each zygote only when its lane is planned (to compare, or to rule this out)."""
FRESH_WORKERS_VARIABLE = "GPUFILL_FRESH_WORKERS"
"""Set to 1 to start every worker as a fresh interpreter, no zygote at all (campaign/executors/forked.py)."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
"""Every library that sizes a thread pool from the environment, set before it is imported (`thread_env`: every
worker's, and the zygote's at 1)."""


def thread_env(threads: int) -> dict[str, str]:
    """The environment that caps every BLAS/OpenMP pool of a worker at its lane's thread count."""
    return dict.fromkeys(THREAD_VARIABLES, str(threads))


LATE_VARIABLES = ("CUDA_VISIBLE_DEVICES",)
"""What a lane may set after the zygote started: read when CUDA starts in a forked worker, never at import."""


@dataclass(eq=False)
class Early:
    process: subprocess.Popen
    ours: socket.socket
    env: dict[str, str]


_early: Early | None = None


def wanted(argv: list[str]) -> bool:
    """Whether this command line runs trials in local workers: `run`/`demo`, not asking for help, the local executor."""
    if not argv or argv[0] not in COMMANDS or os.environ.get(VARIABLE) == "0" or not hasattr(os, "pidfd_open"):
        return False
    if any(arg in ("--help", "-h") for arg in argv):
        return False
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--executor=") else argv[i + 1] if arg == "--executor" and i + 1 < len(argv) else None
        if value is not None and value != "local":
            return False
    return os.environ.get(FRESH_WORKERS_VARIABLE) != "1"


def start(argv: list[str]) -> None:
    """Start the zygote if this command line will want one (its imports begin now, in parallel with ours)."""
    global _early
    if _early is not None or not wanted(argv):
        return
    env = {**os.environ, **thread_env(1)}
    try:
        process, ours = spawn(env)
    except OSError:  # nothing lost: the lane starts its own
        return
    _early = Early(process, ours, env)
    atexit.register(stop)


def spawn(env: dict[str, str]) -> tuple[subprocess.Popen, socket.socket]:
    """A zygote process with `env` (its own session) and our end of its control connection."""
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen([sys.executable, "-m", "gpufill.campaign.worker.zygote", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                   env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


def take(env: dict[str, str]) -> tuple[subprocess.Popen, socket.socket, dict[str, str]] | None:
    """The early zygote for a lane whose workers' environment is `env`: (process, our socket, the variables to send
    it before it forks), or None (none was started, or it would differ in what is read at import: then it stops)."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    later = {k: v for k, v in env.items() if early.env.get(k) != v}
    if set(early.env) - set(env) or set(later) - set(LATE_VARIABLES) or early.process.poll() is not None:
        _stop(early)
        return None
    return early.process, early.ours, later


def stop() -> None:
    """Stop an early zygote that no lane took (at exit, or when the run will not use one)."""
    global _early
    early, _early = _early, None
    if early is not None:
        _stop(early)


def _stop(early: Early) -> None:
    early.ours.close()
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(early.process.pid, signal.SIGKILL)  # its imports would take seconds more before it saw the EOF
    with suppress(subprocess.TimeoutExpired):
        early.process.wait(timeout=10)
