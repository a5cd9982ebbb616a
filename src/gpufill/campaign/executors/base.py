"""What the scheduler needs from an executor, and the messages it gets back.

The scheduler decides what runs next and where; an executor only runs it. Every executor
(local processes, Ray actors, Slurm jobs) offers the same small surface, :class:`Executor`:
a fixed number of slots per lane (`Slots` keeps them), a `Task` submitted to an idle slot, and
`poll` returning what finished (:class:`Finished`) or died (:class:`Crashed`). What a worker says
(policy/messages.py) is what ``worker.TrialRunner.run_task`` sends and returns, wherever it ran:
an executor carries it unchanged. Executors never touch the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from gpufill.campaign.policy.lanes import Lane, visible_gpu
from gpufill.campaign.policy.messages import Heartbeat, Outcome, PackMeasured, Progress, Ready, Started, Task, TaskEnded, TrialEnded
from gpufill.campaign.worker.early import thread_env  # re-exported: the executors' and tests' name for it

if TYPE_CHECKING:
    from gpufill.campaign.spec.build_check import BuildCheck

JobState = Literal["queued", "running", "done", "failed"]


def gpu_env(lane: Lane) -> dict[str, str]:
    """Pins a worker of a per-GPU lane to its GPU: inside, that GPU is cuda:0 and the others are invisible."""
    if lane.gpu_index is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": visible_gpu(lane.gpu_index, os.environ.get("CUDA_VISIBLE_DEVICES"))}


def worker_setup(spec_payload: dict[str, Any], base_dir: str, *, threads: int, device: str, tune_cache: str | None = None,
                 data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a worker needs to start (worker.start_runner): the campaign as JSON-able data, its lane's threads and
    device, and where measured choices (batch search, compile) are cached so the campaign measures each shape once.
    `data`: the projects the scheduler loaded (a worker on this host starts from them: `WorkerSource.hand_data`)."""
    return {"spec": spec_payload, "base_dir": base_dir, "threads": threads, "device": device, "tune_cache": tune_cache, "data": data}


@dataclass(slots=True, eq=False)
class Worker:
    """One slot of a lane: what the scheduler sees of a process, an actor or a job."""

    name: str
    lane: Lane
    task: Task | None = None
    """The task it runs, None while idle."""
    last_shape: str | None = None
    """Shape of its last task: the scheduler prefers to send the same shape again."""
    reports_progress: ClassVar[bool] = False
    """Whether the slot says which trials started and finished within a task and sends heartbeats
    (local processes do; a Ray call or a Slurm job reports only at its end)."""
    started: set[str] = field(default_factory=set)
    """Trials of the task that began training (what a crash fails; the rest go back unattempted)."""
    reported: list[Outcome] = field(default_factory=list)
    """Outcomes of the task's trials already finished, sent before the task's end."""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    """Where its times come from: the scheduler gives each worker its own clock before a task (one clock for
    every time limit it checks)."""
    last_seen: float = field(default_factory=time.monotonic)
    """clock() of its last message or heartbeat."""
    clock_from: float = field(default_factory=time.monotonic)
    """When the trials now training began (their time limit counts from here)."""
    training: int = 1
    """How many trials train together now (a fused pack's size): the time limit scales with it."""
    stop_reason: str | None = None
    """Why the scheduler stopped it (timed out, hung): the crash is reported with this reason."""
    ready: bool = False
    """It finished starting (imports, CUDA context) and sends heartbeats from now on."""
    context_bytes: int | None = None
    """Device memory its CUDA context holds outside PyTorch's allocator, as it measured at start (None: not on a GPU, or unknown)."""
    measured_pack: dict[str, Any] | None = None
    """A pack-size measurement it reported in the middle of its task, not yet taken by the scheduler."""

    def begin(self, task: Task) -> None:
        """A task was submitted: reset what the slot reports about it."""
        self.task = task
        self.last_shape = task.shape
        self.started.clear()
        self.reported.clear()
        self.last_seen = self.clock_from = self.clock()
        self.training = 1
        self.stop_reason = None
        self.measured_pack = None

    def note(self, message: Progress | TaskEnded) -> bool:
        """A progress message from the slot (True) or its task's end (False)."""
        self.last_seen = self.clock()
        match message:
            case TaskEnded():
                return False
            case Heartbeat():
                pass
            case Ready(context_bytes=context):
                self.ready, self.context_bytes = True, context
            case PackMeasured(pack=pack):
                self.measured_pack = pack
            case Started(trial_ids=ids):
                self.started.update(ids)
                self.clock_from, self.training = self.last_seen, len(ids)
            case TrialEnded(outcome=outcome):
                self.reported.append(outcome)
                self.clock_from = self.last_seen
        return True


@dataclass(slots=True)
class WorkerSource:
    """What an executor's workers start from (`worker_setup`): the campaign as data, the folder its paths are read
    from, and the directory caching measured choices per shape (the campaign measures each shape once)."""

    spec_payload: dict[str, Any]
    base_dir: str
    tune_cache: str | None = None
    data: Mapping[str, Any] | None = None
    """The projects the scheduler loaded and listed the trials from (`hand_data`), or None: each worker reads the file."""

    def hand_data(self, projects: Mapping[str, Any]) -> None:
        """Workers on this host start from the scheduler's projects where they are small (`HANDED_DATA_LIMIT_BYTES`):
        they neither read the file again nor import pandas (about a second each), and they train on the very data the
        trial ids name, whatever happens to the file during the run. Larger data each worker reads itself."""
        self.data = projects if data_bytes(projects) <= HANDED_DATA_LIMIT_BYTES else None


HANDED_DATA_LIMIT_BYTES = 16 * 2**20
"""The most data the scheduler sends each local worker at its start. The scheduler sends to one worker at a time: 16 MiB
to each of 16 workers is a quarter of a second at socket speed, against a second each spares (pandas' import and the
file's parse, in parallel). Past it, reading the file in parallel is the faster way."""


def data_bytes(projects: Mapping[str, Any]) -> int:
    """The bytes of the projects' arrays (target, covariates and time index), what sending them costs."""
    return sum(p.target.nbytes + p.covariates.nbytes + (p.time.nbytes if p.time is not None else 0) for p in projects.values())


class Slots:
    """Which of an executor's `workers` (one per slot of each lane) are idle and which busy: every executor's, written once."""

    __slots__ = ()
    workers: list[Any]

    def idle(self, lane: Lane) -> list[Worker]:
        return [w for w in self.workers if w.lane is lane and w.task is None]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.task is not None]


@dataclass(frozen=True, slots=True)
class Finished:
    worker: Worker
    task: Task
    message: TaskEnded


@dataclass(frozen=True, slots=True)
class Crashed:
    """The slot's process, actor or job died with the task: its trials count an attempt each, unless it was killed
    from outside (`environment`)."""

    worker: Worker
    task: Task | None
    reason: str
    environment: bool = False
    """Killed by a signal the scheduler did not send (kill, SIGTERM, the OOM killer): the machine's doing, not the
    trial's; the trial is retried without using an attempt."""


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A batch job outside this process (Slurm), as `gpufill status` shows it."""

    job_id: str
    lane: str
    worker: str
    trial_ids: tuple[str, ...]
    state: JobState
    detail: str
    """The cluster's own word for the state (PENDING, RUNNING, TIMEOUT, ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneRequest:
    """What the campaign asks of the lanes; each executor turns it into lanes on what it runs on."""

    kinds: frozenset[str]
    """Trial kinds present ("neural", "classical")."""
    gpu_slots: int | Literal["auto"]
    cpu_slots: int | Literal["auto"]
    threads_per_trial: int | Literal["auto"]
    memory_margin: float
    where: str
    """The campaign file, named in errors."""
    trial_counts: Mapping[str, int] | None = None
    """The file's trials per kind; None where they are not listed before the run (a search)."""
    cpu_threads_before: int | None = None
    """The threads a CPU trial got in this workdir's first run, where the lane chose them (policy/lanes.py)."""


class Executor(Protocol):
    """Runs tasks in per-lane slots; the scheduler is its only caller."""

    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        """The lanes for this request on what this executor runs on; returns (lanes, warnings)."""
        ...

    def warm(self, lanes: list[Lane], check: BuildCheck | None = None) -> None:
        """Begin what starting these lanes takes while the run still prepares (a local lane's zygote imports torch and
        the trial code), so that `start` finds it under way; nothing where there is nothing to begin early. `check`:
        the file's grid points, built by a process that imports torch anyway (`check.answered_by`); left alone, the
        check starts a child of its own."""
        ...

    def hand_data(self, projects: Mapping[str, Any]) -> None:
        """The projects the scheduler loaded, before `start`: a worker on this host starts from them (local, inline); a
        worker elsewhere reads the file itself (Ray, Slurm)."""
        ...

    def start(self, lanes: list[Lane]) -> None:
        """Make every lane's slots ready (processes, actors; nothing for batch jobs)."""
        ...

    def idle(self, lane: Lane) -> list[Worker]: ...

    def busy(self) -> list[Worker]: ...

    def submit(self, worker: Worker, task: Task) -> None:
        """Start `task` on the idle `worker` (an executor may hold it until the next poll, to batch)."""
        ...

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """What finished or died, waiting at most `timeout` seconds for the first of them."""
        ...

    def jobs(self) -> list[JobInfo]:
        """Batch jobs submitted by this executor and their states (none for local processes or Ray)."""
        ...

    def cancel_jobs(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs an earlier, killed scheduler left queued or running (no-op without batch jobs)."""
        ...

    def pids(self) -> list[int]:
        """Worker processes on this host, for the resource monitor (empty where they run elsewhere)."""
        ...

    def shutdown(self) -> None:
        """Stop every worker (idle ones cleanly); in-flight tasks are abandoned, not reported."""
        ...

    def stop(self, worker: Worker, reason: str) -> None:
        """Kill a busy worker's task (timed out or hung); a later poll reports it as Crashed with `reason`."""
        ...


class NoBatchJobs:
    """For executors whose workers are not batch jobs (local processes, Ray actors): nothing to list or cancel."""

    def jobs(self) -> list[JobInfo]:
        return []

    def cancel_jobs(self, job_ids: Sequence[str]) -> None:
        return None
