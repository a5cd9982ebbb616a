"""Local executor: persistent worker processes on this machine, one per lane slot.

Each worker is a fresh interpreter (`python -m gpufill.campaign.worker`: safe with
torch's threads and CUDA, and unlike multiprocessing's `spawn` it never re-runs the
caller's main module, so a script without a `__main__` guard works). Its thread limits
are in its environment before anything imports a BLAS. It talks to the scheduler over a
socket pair; a worker that dies mid-trial (segfault, kill -9) closes its end, its trial
is reported as crashed, and a fresh worker takes its slot.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from gpufill.campaign.lanes import Lane

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(slots=True)
class Worker:
    name: str
    lane: Lane
    process: Any
    conn: Connection
    task: dict[str, Any] | None = None
    """{"trials": [...], "pack_size": int | None} while busy."""
    last_shape: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    worker: Worker
    task: dict[str, Any]
    message: dict[str, Any]
    """{"results": [per-trial message], "pack": pack-size choice or None}."""


@dataclass(frozen=True, slots=True)
class Crashed:
    worker: Worker
    task: dict[str, Any] | None
    reason: str


@dataclass(slots=True)
class LocalExecutor:
    """Starts, feeds and watches the worker processes of every lane."""

    spec_payload: dict[str, Any]
    base_dir: str
    workers: list[Worker] = field(default_factory=list)
    _counter: int = 0

    def start(self, lanes: list[Lane]) -> None:
        for lane in lanes:
            for _ in range(lane.slots):
                self.workers.append(self._spawn(lane))

    def _spawn(self, lane: Lane) -> Worker:
        ours, theirs = socket.socketpair()
        self._counter += 1
        name = f"{lane.name}-{self._counter}"
        env = {**os.environ, **dict.fromkeys(_THREAD_VARIABLES, str(lane.threads))}
        process = subprocess.Popen(
            [sys.executable, "-m", "gpufill.campaign.worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()  # the child holds its end; closing ours lets recv() see EOF if it dies
        conn = Connection(ours.detach())
        conn.send({"spec": self.spec_payload, "base_dir": self.base_dir, "threads": lane.threads, "device": lane.device})
        return Worker(name=name, lane=lane, process=process, conn=conn)

    def idle(self, lane: Lane) -> list[Worker]:
        return [w for w in self.workers if w.lane is lane and w.task is None]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.task is not None]

    def submit(self, worker: Worker, task: dict[str, Any]) -> None:
        worker.task = task
        worker.last_shape = task["trials"][0]["shape"]
        worker.conn.send(task)

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """Results and deaths that happened within `timeout` seconds."""
        by_conn = {worker.conn: worker for worker in self.workers}
        out: list[Finished | Crashed] = []
        for conn in wait(list(by_conn), timeout=timeout):  # readable: a message, or EOF when it died
            outcome = self._collect(by_conn[conn])
            if outcome is not None:
                out.append(outcome)
        return out

    def _collect(self, worker: Worker) -> Finished | Crashed | None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # its end closed: the process died
            exitcode = worker.process.wait(timeout=30)
            task, worker.task = worker.task, None
            self.workers.remove(worker)
            worker.conn.close()
            self.workers.append(self._spawn(worker.lane))  # a fresh worker takes the slot
            return Crashed(worker, task, _death_reason(exitcode))
        task, worker.task = worker.task, None
        assert task is not None
        return Finished(worker, task, message)

    def shutdown(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            try:
                worker.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=5)
            worker.conn.close()
        self.workers.clear()


def _death_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker process died with {name} (exit code {exitcode}) during the trial"
    return f"worker process exited with code {exitcode} during the trial"
