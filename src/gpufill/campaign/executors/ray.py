"""Ray executor: one long-lived actor per lane slot, on a local Ray instance or a cluster.

An actor is a worker process that Ray places: it loads the campaign once and serves task
after task as method calls (no interpreter or torch start-up per trial), with
``num_cpus`` = the lane's threads and, on the GPU lane, ``1/slots`` of a GPU, so the
lane's slots share one GPU exactly as local workers do (the scheduler admits GPU tasks
by measured memory); a whole GPU per slot would leave every slot past the GPU count
waiting forever. Thread limits are in the actor's ``runtime_env`` before its process
imports a BLAS. Results come back as object refs collected with ``ray.wait``; an actor
that dies (kill -9, segfault, lost node) fails its ref with ``RayActorError``: its task is
reported as crashed and a fresh actor takes the slot. A task submitted to an actor still starting waits in the
actor's queue behind its start-up (imports, the campaign's load: over a minute on a loaded machine), so the trial's
time limit counts from when the actor has started (its ``pid`` call, queued first, has answered), not from the submit.

Without an address it starts a private local Ray instance sized to the lanes and stops it
at the end (restoring the environment variables ``ray.init`` sets); with one it joins
that cluster and plans the lanes from the cluster's CPUs and GPU memory. An already
initialised Ray (a notebook, a test session) is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpufill.campaign.executors.base import Crashed, Finished, LaneRequest, NoBatchJobs, Slots, Worker, thread_env, worker_setup
from gpufill.campaign.executors.local import plan_here, plan_on
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Task, TaskEnded
from gpufill.errors import InputError

if TYPE_CHECKING:
    from gpufill.campaign.spec.build_check import BuildCheck

INSTALL_FIX = "pip install 'gpufill[ray]'"
# A GPU probe on a cluster: longer than a cold worker start on a busy node, short enough to fail visibly.
PROBE_TIMEOUT_S = 120.0


def import_ray() -> Any:
    """The ray module, or an InputError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray, which is not installed", where="command line", field="--executor", fix=INSTALL_FIX) from None
    return ray


class _Slot:
    """The actor: one worker process serving one lane slot (see worker.start_runner)."""

    def __init__(self, setup: dict[str, Any]):
        from gpufill.campaign.worker.worker import start_runner

        self.runner = start_runner(setup)

    def run(self, task: Task) -> TaskEnded:
        return self.runner.run_task(task)

    def pid(self) -> int:
        return os.getpid()


@dataclass(slots=True, eq=False)
class RayWorker(Worker):
    actor: Any = None
    ref: Any = None
    """The pending result of its task."""
    pid_ref: Any = None
    """The actor's pid once it has started (see pids)."""
    pid: int | None = None


@dataclass(slots=True)
class RayExecutor(Slots, NoBatchJobs):
    spec_payload: dict[str, Any]
    base_dir: str
    tune_cache: str | None = None
    """Directory caching measured choices per shape (on a cluster: only where the nodes share it)."""
    address: str | None = None
    """A Ray cluster's address ("auto", "ray://host:10001", "host:6379"); None: a local Ray of our own."""
    workers: list[RayWorker] = field(default_factory=list)
    _ray: Any = None
    _started_ray: bool = False
    _saved_env: dict[str, str] | None = None
    _actor_class: Any = None
    _counter: int = 0

    def __post_init__(self) -> None:
        self._ray = import_ray()

    # -- lanes ----------------------------------------------------------------------------
    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        """A local Ray runs on this machine: plan as the local executor does; a cluster: from its resources."""
        ray = self._ray
        if self.address is None:
            return plan_here(request)
        self._init()
        resources = ray.cluster_resources()
        cores = int(resources.get("CPU", 0))
        if cores < 1:
            raise InputError(f"the Ray cluster at {self.address} offers no CPUs", where="command line", field="--address", fix="start Ray nodes with CPUs, or drop --address to run locally")
        gpu_memory = self._probe_gpu_memory() if resources.get("GPU", 0) >= 1 else None
        # the cluster's CPUs are summed over its nodes: a trial given "the idle cores" could ask for more than any node
        # has, and Ray would never place it; a cluster's trials take one core each unless the file says otherwise
        return plan_on(replace(request, trial_counts=None, cpu_threads_before=None), cores=cores, gpu_memory_bytes=gpu_memory)

    def _probe_gpu_memory(self) -> int:
        """Total memory of a cluster GPU, measured on a GPU node (the driver may have none)."""
        ray = self._ray

        def total_memory() -> int:
            import torch

            return int(torch.cuda.get_device_properties(0).total_memory)

        ref = ray.remote(num_gpus=1, num_cpus=0)(total_memory).remote()
        ready, _ = ray.wait([ref], timeout=PROBE_TIMEOUT_S)
        if not ready:
            raise InputError(f"no GPU of the Ray cluster at {self.address} answered within {PROBE_TIMEOUT_S:.0f} s", where="command line",
                             field="--address", fix="check that the cluster's GPU nodes are up and idle (ray status)")
        return int(ray.get(ref))

    # -- life cycle -----------------------------------------------------------------------
    def _init(self, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        self._saved_env = dict(os.environ)
        common = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if self.address is not None:
            ray.init(address=self.address, **common)
        else:  # a private instance: never join a cluster that RAY_ADDRESS happens to name
            os.environ.pop("RAY_ADDRESS", None)
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, **common)
        self._started_ray = True

    def hand_data(self, projects: Mapping[str, Any]) -> None:
        return None  # an actor may run on another machine: it reads the file itself

    def warm(self, lanes: list[Lane], check: BuildCheck | None = None) -> None:
        return None  # nothing to begin before `start`

    def start(self, lanes: list[Lane]) -> None:
        # A local instance holds exactly the lanes' CPUs (the lane plan already fits them to
        # this machine's cores), so every actor can be placed.
        needed = sum(lane.slots * lane.threads for lane in lanes)
        gpus = 1 if any(lane.device.startswith("cuda") for lane in lanes) else 0
        if gpus:
            import torch

            gpus = torch.cuda.device_count()
        self._init(num_cpus=max(needed, 1), num_gpus=gpus)
        self._actor_class = self._ray.remote(_Slot)
        for lane in lanes:
            for _ in range(lane.slots):
                self.workers.append(self._spawn(lane))

    def _spawn(self, lane: Lane) -> RayWorker:
        self._counter += 1
        on_gpu = lane.device.startswith("cuda")
        actor = self._actor_class.options(
            num_cpus=lane.threads,
            num_gpus=1.0 / lane.slots if on_gpu else 0,
            runtime_env={"env_vars": thread_env(lane.threads)},
            max_restarts=0,  # a fresh actor is started here, with its trial counted as crashed
            max_concurrency=1,
        ).remote(worker_setup(self.spec_payload, self.base_dir, threads=lane.threads, device=lane.device, tune_cache=self.tune_cache))
        return RayWorker(name=f"{lane.name}-{self._counter}", lane=lane, actor=actor, pid_ref=actor.pid.remote())

    def shutdown(self) -> None:
        ray = self._ray
        for worker in self.workers:
            _kill(ray, worker.actor)
        self.workers.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
            if self._saved_env is not None:  # ray.init sets RAY_* and PYTHONBREAKPOINT for its own use
                os.environ.clear()
                os.environ.update(self._saved_env)

    # -- tasks ----------------------------------------------------------------------------

    def submit(self, worker: Worker, task: Task) -> None:
        assert isinstance(worker, RayWorker)
        worker.begin(task)
        worker.ref = worker.actor.run.remote(task)

    def stop(self, worker: Worker, reason: str) -> None:
        assert isinstance(worker, RayWorker)
        worker.stop_reason = reason
        _kill(self._ray, worker.actor)  # its call then fails: reported as Crashed with the reason

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        ray = self._ray
        by_ref = {w.ref: w for w in self.workers if w.task is not None}
        if not by_ref:
            return []
        refs = list(by_ref)
        ready, waiting = ray.wait(refs, num_returns=1, timeout=timeout)  # the first result, or the timeout
        if ready and waiting:  # and every other one that is ready too
            ready += ray.wait(waiting, num_returns=len(waiting), timeout=0)[0]
        self._note_started()
        return [self._collect(by_ref[ref]) for ref in ready]

    def _note_started(self) -> None:
        """A busy actor that has now finished starting: its trial's clock starts here (module docstring). Before
        the scheduler checks the time limits, which it does after each poll."""
        ray = self._ray
        for worker in self.workers:
            if worker.task is None or worker.ready or worker.pid_ref is None:
                continue
            if ray.wait([worker.pid_ref], timeout=0)[0]:
                worker.ready = True
                worker.clock_from = worker.clock()

    def _collect(self, worker: RayWorker) -> Finished | Crashed:
        ray = self._ray
        task, worker.task, ref, worker.ref = worker.task, None, worker.ref, None
        assert task is not None
        outside = False
        try:
            return Finished(worker, task, ray.get(ref))
        except ray.exceptions.RayActorError as error:  # the actor's process or node is gone
            reason = f"Ray actor died during the trial ({type(error).__name__}: {_first_line(error)})"
            # Killed, out of memory by Ray's monitor, or its node lost: Ray does not say which signal, and a trial's own
            # error is caught inside run_task, so the environment's (uses no attempt; bounded: policy/environment.py).
            outside = True
        except ray.exceptions.RayError as error:  # run_task itself raised (trial errors are caught inside)
            reason = f"Ray task failed ({type(error).__name__}: {_first_line(error)})"
        self.workers.remove(worker)
        _kill(ray, worker.actor)
        self.workers.append(self._spawn(worker.lane))  # a fresh actor takes the slot
        return Crashed(worker, task, worker.stop_reason or reason, environment=outside and worker.stop_reason is None)

    # -- monitoring -----------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Actor processes, once they have said who they are (a cluster's remote pids mean nothing here)."""
        if self.address is not None:
            return []
        ray = self._ray
        workers = list(self.workers)  # called from the sampler's thread
        for worker in workers:
            if worker.pid is None and worker.pid_ref is not None and ray.wait([worker.pid_ref], timeout=0)[0]:
                try:
                    worker.pid = int(ray.get(worker.pid_ref))
                except ray.exceptions.RayError:
                    worker.pid_ref = None
        return [w.pid for w in workers if w.pid is not None]


def _kill(ray: Any, actor: Any) -> None:
    """Stop an actor; one already dead, or on a cluster that is gone, needs nothing more."""
    with contextlib.suppress(ray.exceptions.RayError, ValueError, ConnectionError):
        ray.kill(actor, no_restart=True)


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else "no detail"
