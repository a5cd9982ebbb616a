"""A lane's zygote: one interpreter that imports what every worker imports, then forks the lane's workers.

Importing torch costs seconds of CPU (2.7 s on a 2-core EPYC, more under load), and a campaign starts one worker per
lane slot and a fresh one after each crash. The zygote starts as a worker used to (`python -m
gpufill.campaign.worker.zygote FD`: one thread in every pool and the lane's GPU in its environment, its own session),
imports `PRELOAD` once, and from then on only forks: each child is the fresh worker it replaces, minus the imports (a
worker of a lane of several threads takes its count first: campaign/worker/worker.py, take_lane_threads).

It forks only while it is one thread with no CUDA context: a fork copies a lock held by a thread that the child does
not have, and CUDA cannot be used in a fork of a process that initialised it; a worker of several threads, only where
its torch's MKL count can be set after the fork. Otherwise it refuses, and the executor starts that worker as a fresh
interpreter (executors/forked.py).

Told a campaign file's grid points to build (("check", IN, OUT): campaign/spec/build_check.py, the first lane's
zygote), it forks a child that builds them as soon as its imports are done, so the machine imports torch once for
both; the child's exit is reported like a worker's. A zygote started before its lane was planned
(campaign/worker/early.py) is told its lane's GPU (("env", {variable: value})) before it forks anything.

Protocol on the control connection: the executor sends ("fork", threads) and the worker's socket (SCM_RIGHTS); the zygote
answers ("forked", pid) once the child leads its own process group (so a kill of the group reaches it), or
("refused", why); and ("exited", pid, returncode) when a child ends, returncode as subprocess gives it (-N for signal
N). When the executor goes away (EOF) the zygote ends; its children end on their own sockets' EOF, as workers do.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing import reduction
from pathlib import Path
from multiprocessing.connection import Connection, wait

PRELOAD = ("torch", "gpufill.campaign.worker.worker", "gpufill.forecasting.run", "gpufill.forecasting.models.classical.training",
           "gpufill.forecasting.models.builtin", "gpufill.campaign.worker.packs")
"""What every worker imports before its first trial; none of it starts a thread (pandas would: pyarrow's allocator)."""


def fork_refusal(threads: int = 1) -> str | None:
    """Why forking a worker of `threads` now would be unsafe, its child could not be watched or could not take its
    lane's thread count (campaign/worker/worker.py: take_lane_threads), or None."""
    if threads > 1:
        from gpufill.forecasting.run import forked_threads_settable

        if not forked_threads_settable():
            return f"this torch's MKL cannot be given {threads} threads after the fork"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as error:  # a sandbox's seccomp filter may refuse the call the kernel has
        return f"os.pidfd_open is refused here ({error})"
    running = len(os.listdir("/proc/self/task"))
    if running > 1:
        return f"the zygote runs {running} threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the zygote initialised CUDA"
    return None


def serve(control: Connection) -> None:
    """Fork a worker for each request on `control` and report each child's end, until `control` closes."""
    for name in PRELOAD:
        importlib.import_module(name)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for ready in wait([control, *children]):
            if ready is control:
                try:
                    request = control.recv()
                    if request[0] == "env":
                        os.environ.update(request[1])
                        continue
                    if request[0] == "check":
                        if fork_refusal() is None:  # refused: the scheduler sees no answer and builds them itself
                            pid = _fork_then(lambda paths=request[1:]: _build(paths), control, children)
                            children[os.pidfd_open(pid)] = pid
                        continue
                    worker_fd = reduction.recv_handle(control)  # ("fork", the lane's threads)
                except (EOFError, OSError):
                    return
                refusal = fork_refusal(request[1] if len(request) > 1 else 1)
                if refusal is not None:
                    os.close(worker_fd)
                    control.send(("refused", refusal))
                    continue
                pid = _fork(worker_fd, control, children)
                children[os.pidfd_open(pid)] = pid
                control.send(("forked", pid))
            else:
                pid = children.pop(ready)
                os.close(ready)
                _, status = os.waitpid(pid, 0)
                try:
                    control.send(("exited", pid, os.waitstatus_to_exitcode(status)))
                except OSError:
                    return


def _fork(worker_fd: int, control: Connection, children: dict[int, int]) -> int:
    """The worker child's pid, once it leads its own session."""
    pid = _fork_then(lambda: _run_worker(worker_fd), control, children)
    os.close(worker_fd)
    return pid


def _fork_then(life: Callable[[], None], control: Connection, children: dict[int, int]) -> int:
    """A child's pid, once it leads its own session; the child lives `life` and never returns here."""
    led_r, led_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # as start_new_session: a terminal's Ctrl-C reaches the scheduler only, and killpg(pid) reaches it all
        os.close(led_w)
        os.close(led_r)
        control.close()
        for pidfd in children:
            os.close(pidfd)
        life()
    os.close(led_w)
    os.read(led_r, 1)  # EOF once the child closed its end: it has called setsid (or died)
    os.close(led_r)
    return pid


def _build(check: tuple[str, str]) -> None:
    """The check child's life: build the grid points, write the answer, exit without the interpreter's teardown."""
    code = 0
    try:
        from gpufill.campaign.spec.build_check import main

        main(Path(check[0]), Path(check[1]))
    except FileNotFoundError:  # the scheduler stopped waiting (its folder is gone): nobody to answer
        code = 1
    except BaseException:  # noqa: BLE001 - no answer: the scheduler builds them itself
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _run_worker(worker_fd: int) -> None:
    """The child's life: the worker, then the exit a fresh interpreter would make (atexit hooks, flushed output)."""
    code = 0
    try:
        from gpufill.campaign.worker.worker import worker_main

        worker_main(Connection(worker_fd), forked=True)
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 - the worker's crash, printed as an interpreter would
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":  # started by executors/forked.py or worker/early.py: python -m gpufill.campaign.worker.zygote FD
    serve(Connection(int(sys.argv[1])))
    os._exit(0)  # nothing to flush: skip torch's interpreter teardown (~0.5 s), as a worker does
