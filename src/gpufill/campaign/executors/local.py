"""Local executor: persistent worker processes on this machine, one per lane slot.

Workers are started with the `spawn` method (a fresh interpreter: safe with torch's
threads and CUDA) and with their thread limits in the environment before anything
imports a BLAS. A worker that dies mid-trial (exception outside a trial, segfault,
kill -9) is noticed through its process sentinel: its trial is reported as crashed and
a fresh worker takes its slot.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from gpufill.campaign.lanes import Lane
from gpufill.campaign.worker import worker_main

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(slots=True)
class Worker:
    name: str
    lane: Lane
    process: Any
    conn: Connection
    trial: dict[str, Any] | None = None
    last_shape: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    worker: Worker
    trial: dict[str, Any]
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Crashed:
    worker: Worker
    trial: dict[str, Any] | None
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
        context = mp.get_context("spawn")
        parent, child = context.Pipe()
        self._counter += 1
        name = f"{lane.name}-{self._counter}"
        process = context.Process(
            target=worker_main,
            args=(child, self.spec_payload, self.base_dir, lane.threads, lane.device),
            name=f"gpufill-worker-{name}",
            daemon=True,
        )
        with _thread_environment(lane.threads):
            process.start()
        child.close()  # the child holds its end; closing ours lets recv() see EOF if it dies
        return Worker(name=name, lane=lane, process=process, conn=parent)

    def idle(self, lane: Lane) -> list[Worker]:
        return [w for w in self.workers if w.lane is lane and w.trial is None]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.trial is not None]

    def submit(self, worker: Worker, trial: dict[str, Any]) -> None:
        worker.trial = trial
        worker.last_shape = trial["shape"]
        worker.conn.send(trial)

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """Results and deaths that happened within `timeout` seconds."""
        by_handle: dict[Any, Worker] = {}
        for worker in self.workers:
            by_handle[worker.conn] = worker
            by_handle[worker.process.sentinel] = worker
        ready = wait(list(by_handle), timeout=timeout)
        out: list[Finished | Crashed] = []
        seen: set[str] = set()
        for handle in ready:
            worker = by_handle[handle]
            if worker.name in seen:
                continue
            seen.add(worker.name)
            outcome = self._collect(worker)
            if outcome is not None:
                out.append(outcome)
        return out

    def _collect(self, worker: Worker) -> Finished | Crashed | None:
        try:
            if worker.conn.poll():
                message = worker.conn.recv()
                trial, worker.trial = worker.trial, None
                assert trial is not None and message["trial_id"] == trial["trial_id"]
                return Finished(worker, trial, message)
        except (EOFError, OSError):
            pass
        if worker.process.is_alive():
            return None
        worker.process.join(timeout=1)
        trial, worker.trial = worker.trial, None
        self.workers.remove(worker)
        worker.conn.close()
        self.workers.append(self._spawn(worker.lane))  # a fresh worker takes the slot
        return Crashed(worker, trial, _death_reason(worker.process.exitcode))

    def shutdown(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
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


@contextmanager
def _thread_environment(threads: int) -> Iterator[None]:
    """Thread limits in the environment a spawned worker inherits, then restored here."""
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in _THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
