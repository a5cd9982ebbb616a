"""Local executor: persistent worker processes on this machine, one per lane slot.

Each worker is forked from its lane's zygote (executors/forked.py), an interpreter that
imported torch and the trial code once, or where that is not possible is a fresh one
(`python -m gpufill.campaign.worker.worker`). Either way it is a new process that never
re-runs the caller's main module (unlike multiprocessing's `spawn`, so a script without a
`__main__` guard works). A fresh worker's thread limits are in its environment before anything
imports a BLAS; a forked one takes its lane's after the fork. It talks to the scheduler over a
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
from typing import Any, ClassVar

from gpufill.campaign.executors.base import Crashed, Finished, LaneRequest, NoBatchJobs, Slots, Worker, WorkerSource, gpu_env, thread_env, worker_setup
from gpufill.campaign.executors.forked import Zygote, forks_workers
from gpufill.campaign.policy.lanes import Lane, plan_lanes
from gpufill.campaign.policy.messages import Task
from gpufill.campaign.spec.build_check import BuildCheck
from gpufill.cpus import usable_cpus
from gpufill.gpus import visible_gpu_memory


@dataclass(slots=True, eq=False)
class LocalWorker(Worker):
    process: Any = None
    conn: Connection | None = None
    reports_progress: ClassVar[bool] = True


def plan_on(request: LaneRequest, *, cores: int, gpu_memory_bytes: int | list[int] | None) -> tuple[list[Lane], list[str]]:
    """`plan_lanes` for `request` on `cores` CPUs and GPUs of `gpu_memory_bytes` (one or a list; None: no GPU)."""
    return plan_lanes(
        kinds=request.kinds, cores=cores, gpu_memory_bytes=gpu_memory_bytes, gpu_slots=request.gpu_slots, cpu_slots=request.cpu_slots,
        threads_per_trial=request.threads_per_trial, memory_margin=request.memory_margin, where=request.where,
        trial_counts=request.trial_counts, cpu_threads_before=request.cpu_threads_before,
    )


def plan_here(request: LaneRequest) -> tuple[list[Lane], list[str]]:
    """Lanes for this machine: its cores and every visible GPU's memory (no GPU lane without CUDA), read from NVML
    without importing torch (gpufill.gpus); from torch only where NVML cannot answer as CUDA would."""
    memories = visible_gpu_memory()
    if memories is None:
        import torch

        memories = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return plan_on(request, cores=usable_cpus(), gpu_memory_bytes=memories or None)


@dataclass(slots=True)
class LocalExecutor(WorkerSource, Slots, NoBatchJobs):
    """Starts, feeds and watches the worker processes of every lane."""

    workers: list[LocalWorker] = field(default_factory=list)
    zygotes: dict[str, Zygote] = field(default_factory=dict)
    """Each lane's zygote, by lane name (none where forking is not possible)."""
    _counter: int = 0

    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        return plan_here(request)

    def warm(self, lanes: list[Lane], check: BuildCheck | None = None) -> None:
        for lane in lanes:  # every lane's zygote imports at once; the first builds the file's grid points too
            if forks_workers() and lane.name not in self.zygotes:
                zygote = Zygote(_lane_env(lane, zygote=True), check=(str(check.request), str(check.answer)) if check is not None else None)
                zygote.start()
                if check is not None:
                    check.answered_by(zygote.process)
                    check = None
                self.zygotes[lane.name] = zygote

    def start(self, lanes: list[Lane]) -> None:
        self.warm(lanes)  # those warmed while the run prepared are under way already
        for lane in lanes:
            for _ in range(lane.slots):
                self.workers.append(self._spawn(lane))

    def _spawn(self, lane: Lane) -> LocalWorker:
        ours, theirs = socket.socketpair()
        self._counter += 1
        zygote = self.zygotes.get(lane.name)
        process = zygote.fork(theirs.fileno(), lane.threads) if zygote is not None else None
        if process is None and zygote is not None:  # a fork that failed half-way may have left a child holding `theirs`:
            ours.close()  # a new pair, so that child sees EOF and ends, and the fresh worker's socket is its own
            theirs.close()
            ours, theirs = socket.socketpair()
        if process is None:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpufill.campaign.worker.worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=_lane_env(lane),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C or hang-up reaches the scheduler only; it stops the workers
            )
        theirs.close()  # the child holds its end; closing ours lets recv() see EOF if it dies
        conn = Connection(ours.detach())
        conn.send(worker_setup(self.spec_payload, self.base_dir, threads=lane.threads, device=lane.device, tune_cache=self.tune_cache, data=self.data))
        return LocalWorker(name=f"{lane.name}-{self._counter}", lane=lane, process=process, conn=conn)

    def submit(self, worker: Worker, task: Task) -> None:
        assert isinstance(worker, LocalWorker) and worker.conn is not None
        worker.begin(task)
        worker.conn.send(task)

    def stop(self, worker: Worker, reason: str) -> None:
        assert isinstance(worker, LocalWorker)
        worker.stop_reason = reason
        _kill_group(worker.process)  # SIGKILL reaches a stopped (SIGSTOP) process too; its EOF reports the crash

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """Results and deaths that happened within `timeout` seconds."""
        by_conn = {worker.conn: worker for worker in self.workers}
        out: list[Finished | Crashed] = []
        for conn in wait(list(by_conn), timeout=timeout):  # readable: a message, or EOF when it died
            outcome = self._collect(by_conn[conn])
            if outcome is not None:
                out.append(outcome)
        return out

    def _collect(self, worker: LocalWorker) -> Finished | Crashed | None:
        assert worker.conn is not None
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # its end closed: the process died
            exitcode = worker.process.wait(timeout=30)
            task, worker.task = worker.task, None
            self.workers.remove(worker)
            worker.conn.close()
            self.workers.append(self._spawn(worker.lane))  # a fresh worker takes the slot
            return Crashed(worker, task, worker.stop_reason or death_reason(exitcode), environment=worker.stop_reason is None and from_outside(exitcode))
        if worker.note(message):  # a heartbeat, or a trial that started or finished: the task goes on
            return None
        task, worker.task = worker.task, None
        assert task is not None
        return Finished(worker, task, message)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def shutdown(self) -> None:
        for worker in self.workers:
            if worker.task is not None:  # in flight (a stopped run): abandoned, so stop it now rather than after its trial
                _kill_group(worker.process)
                continue
            try:
                worker.conn.send(None)  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            try:
                worker.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=5)
            worker.conn.close()  # type: ignore[union-attr]
        self.workers.clear()
        for zygote in self.zygotes.values():
            zygote.close()
        self.zygotes.clear()


def _lane_env(lane: Lane, *, zygote: bool = False) -> dict[str, str]:
    """A lane's worker environment (or its zygote's, at one thread: campaign/executors/forked.py): thread limits and
    GPU set before anything imports a BLAS or CUDA."""
    return {**os.environ, **thread_env(1 if zygote else lane.threads), **gpu_env(lane)}


def _kill_group(process: Any) -> None:
    """SIGKILL the worker and what it started (it leads its own session: DataLoader workers, compilers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


KILLING_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""Signals that end a worker from outside (a user's kill, the OOM killer, a shutdown); a SIGSEGV or SIGABRT is the trial's own crash."""


def killed(exitcode: int | None) -> bool:
    """Whether a worker's exit code says a signal from outside ended it."""
    return exitcode is not None and exitcode < 0 and -exitcode in KILLING_SIGNALS


def from_outside(exitcode: int | None) -> bool:
    """Whether a worker's end is the environment's, not its trial's: a killing signal, or no exit code at all (a forked
    worker whose zygote was killed first: its code went with it, and a zygote runs no trial code, so something outside
    ended it; the environment's failures are bounded per trial: policy/environment.py)."""
    return exitcode is None or killed(exitcode)


def death_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker process ended after its lane's zygote was killed (its exit code went with it) during the trial"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker process died with {name} (exit code {exitcode}) during the trial"
    return f"worker process exited with code {exitcode} during the trial"
