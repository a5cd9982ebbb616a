"""Slurm executor: each task (a trial or a fused pack) is one Slurm job, submitted with submitit.

A lane has `slots` jobs queued or running at most (resources.slurm.max_jobs, or
--gpu-slots/--cpu-slots); the tasks the scheduler hands out in one round are submitted as
one job array per lane. A job is a fresh process that runs ``worker.run_job`` (the same
task code as a local worker or a Ray actor) and pickles its message into the submitit
folder (WORKDIR/slurm); `poll` collects finished jobs. A job that fails outside the
trial's own code (killed, out of memory, timed out, pre-empted, node failure) raises
submitit's ``UncompletedJobError``/``FailedJobError``: it becomes a crash, and the
scheduler retries its trials in a new job. Job ids and states go to the store through the
scheduler (its only writer), for `gpufill status`. A job's trial time limit counts from when the job left the queue
(its state is no longer a queued one): the wait for a node is the cluster's, not the trial's.

``resources.slurm.cluster: local`` runs the same jobs as processes on this machine
(submitit's local executor): a campaign can be tried, and this code tested, without Slurm.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufill.campaign.executors.base import (
    Crashed,
    Finished,
    JobInfo,
    JobState,
    LaneRequest,
    Slots,
    Worker,
    thread_env,
    worker_setup,
)
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Task
from gpufill.errors import InputError

if TYPE_CHECKING:
    from gpufill.campaign.spec.build_check import BuildCheck
    from gpufill.campaign.spec.spec import SlurmSpec

INSTALL_FIX = "pip install 'gpufill[slurm]'"
# Slurm states of a job that has not started yet (UNKNOWN: just submitted, sacct has no row yet).
_QUEUED = {"PENDING", "REQUEUED", "CONFIGURING", "READY", "SUSPENDED", "UNKNOWN", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED", "SUBMITTED"}


def import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise InputError("--executor slurm needs submitit, which is not installed", where="command line", field="--executor", fix=INSTALL_FIX) from None
    return submitit


@dataclass(slots=True, eq=False)
class SlurmWorker(Worker):
    job: Any = None
    """The submitit job of its task (None while the task waits to be submitted)."""


@dataclass(slots=True)
class _Record:
    lane: str
    worker: str
    trial_ids: tuple[str, ...]
    state: JobState = "queued"
    detail: str = "SUBMITTED"


@dataclass(slots=True)
class SlurmExecutor(Slots):
    spec_payload: dict[str, Any]
    base_dir: str
    folder: Path
    """Where submitit writes job scripts, pickles and logs (WORKDIR/slurm/<job id>)."""
    settings: SlurmSpec
    name: str
    """The campaign's name: the jobs' name."""
    tune_cache: str | None = None
    """Directory (shared by the jobs) caching measured choices per shape."""
    workers: list[SlurmWorker] = field(default_factory=list)
    _submitit: Any = None
    _refused: type[Exception] = Exception
    _uncompleted: type[Exception] = Exception
    _executors: dict[str, Any] = field(default_factory=dict)
    _unsubmitted: list[SlurmWorker] = field(default_factory=list)
    _records: dict[str, _Record] = field(default_factory=dict)
    _ended: list[str] = field(default_factory=list)
    """Jobs that ended since `jobs()` last reported."""

    def __post_init__(self) -> None:
        self._submitit = import_submitit()
        from submitit.core.utils import FailedSubmissionError, UncompletedJobError

        self._refused, self._uncompleted = FailedSubmissionError, UncompletedJobError

    # -- lanes ----------------------------------------------------------------------------
    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        """Lanes from resources.slurm: jobs at once per lane, each with its own GPU and cores."""
        s = self.settings
        if s.cluster == "slurm" and shutil.which("sbatch") is None:
            raise InputError("sbatch is not on this machine's PATH", where=request.where, field="resources.slurm.cluster",
                             fix="run from a Slurm login node, or set resources.slurm.cluster: local to run the jobs here")
        warnings: list[str] = []
        gpus = s.gpus_per_job
        if s.cluster == "local" and gpus:
            import torch

            if not torch.cuda.is_available():
                gpus = 0
                if "neural" in request.kinds:
                    warnings.append("resources.slurm.gpus_per_job 1 but this machine (cluster: local) has no GPU: neural jobs run on CPUs")
        if s.cluster == "local":
            from gpufill.engine.hardware import cpu_count

            # Local jobs share this machine: as many at once as its cores hold.
            auto_slots = max(1, cpu_count() // s.cpus_per_task)
            why = f"{auto_slots} jobs at once x {s.cpus_per_task} CPUs: this machine's cores (cluster: local)"
        else:
            auto_slots = s.max_jobs
            why = f"up to {auto_slots} jobs queued or running (resources.slurm.max_jobs), {s.cpus_per_task} CPUs each"
        lanes: list[Lane] = []
        neural_on_gpu = "neural" in request.kinds and gpus > 0
        if neural_on_gpu:
            slots = auto_slots if request.gpu_slots == "auto" else int(request.gpu_slots)
            reason = (why if request.gpu_slots == "auto" else f"{slots} jobs at once requested") + ", 1 GPU each"
            # Each job has a GPU of its own: no shared memory budget to admit against.
            lanes.append(Lane(name="gpu", slots=slots, threads=s.cpus_per_task, device="cuda:0", kinds=("neural",), queue="gpu", memory_budget_bytes=None, reason=reason))
        cpu_kinds = tuple(k for k in ("neural", "classical") if k in request.kinds and not (k == "neural" and neural_on_gpu))
        if cpu_kinds:
            slots = auto_slots if request.cpu_slots == "auto" else int(request.cpu_slots)
            reason = why if request.cpu_slots == "auto" else f"{slots} jobs at once requested, {s.cpus_per_task} CPUs each"
            lanes.append(Lane(name="cpu", slots=slots, threads=s.cpus_per_task, device="cpu", kinds=cpu_kinds, queue="cpu", memory_budget_bytes=None, reason=reason))
        return lanes, warnings

    # -- life cycle -----------------------------------------------------------------------
    def hand_data(self, projects: Mapping[str, Any]) -> None:
        return None  # a job runs on another machine: it reads the file itself

    def warm(self, lanes: list[Lane], check: BuildCheck | None = None) -> None:
        return None  # nothing to begin before `start`

    def start(self, lanes: list[Lane]) -> None:
        """A submitit executor per lane (its jobs' resources); no job starts before a task is submitted."""
        s = self.settings
        for lane in lanes:
            executor = self._submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=s.cluster)
            exports = [f"export {key}={value}" for key, value in thread_env(lane.threads).items()]  # before Python starts
            parameters: dict[str, Any] = {
                "name": f"gpufill-{self.name}-{lane.name}",
                "timeout_min": s.timeout_min,
                "cpus_per_task": s.cpus_per_task,
                "slurm_setup": exports,
                "local_setup": exports,
                "slurm_array_parallelism": lane.slots,
            }
            if lane.device.startswith("cuda"):  # CPU lanes ask for no GPU at all: --gpus-per-node=0 is refused where no GPU gres exists
                parameters["gpus_per_node"] = 1
            if s.partition is not None:
                parameters["slurm_partition"] = s.partition
            if s.mem_gb is not None:
                parameters["mem_gb"] = s.mem_gb
            if s.sbatch:
                parameters["slurm_additional_parameters"] = dict(s.sbatch)
            executor.update_parameters(**parameters)
            self._executors[lane.name] = executor
            self.workers += [SlurmWorker(name=f"{lane.name}-{i + 1}", lane=lane) for i in range(lane.slots)]

    def shutdown(self) -> None:
        """Cancel the jobs still queued or running: their trials go back to pending with the run."""
        active = [w for w in self.workers if w.job is not None and w.task is not None]
        for worker in active:
            try:
                worker.job.cancel(check=False)
            except (OSError, subprocess.SubprocessError):  # scancel missing or failing: the job ends at its time limit
                pass
            self._end(worker.job.job_id, "failed", "CANCELLED (run stopped)")
            worker.task = worker.job = None
        self._unsubmitted.clear()

    # -- tasks ----------------------------------------------------------------------------

    def submit(self, worker: Worker, task: Task) -> None:
        """Held until the next poll, so that a round's tasks go in as one job array per lane."""
        assert isinstance(worker, SlurmWorker)
        worker.begin(task)
        worker.ready = False  # a new job: queued until its state says otherwise
        self._unsubmitted.append(worker)

    def stop(self, worker: Worker, reason: str) -> None:
        assert isinstance(worker, SlurmWorker)
        worker.stop_reason = reason
        if worker.job is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # the job then ends without a result: Crashed
                worker.job.cancel(check=False)

    def _flush(self) -> None:
        by_lane: dict[str, list[SlurmWorker]] = {}
        for worker in self._unsubmitted:
            by_lane.setdefault(worker.lane.name, []).append(worker)
        self._unsubmitted.clear()
        for lane_name, workers in by_lane.items():
            from gpufill.campaign.worker.worker import (
                run_job,  # pickled by name: the job imports it
            )

            executor = self._executors[lane_name]
            lane = workers[0].lane
            setup = worker_setup(self.spec_payload, self.base_dir, threads=lane.threads, device=lane.device, tune_cache=self.tune_cache)
            try:
                with executor.batch():
                    jobs = [executor.submit(run_job, setup, w.task) for w in workers]
            except self._refused as error:
                raise InputError(f"Slurm refused the jobs: {_first_line(error)}", where="resources.slurm", field="resources.slurm",
                                 fix="check the partition, time limit and sbatch options against `sinfo` and your account") from None
            for worker, job in zip(workers, jobs, strict=True):
                worker.job = job
                assert worker.task is not None
                self._records[job.job_id] = _Record(lane=lane_name, worker=worker.name, trial_ids=tuple(t.trial_id for t in worker.task.trials))

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """Submit the round's tasks, then collect finished jobs (waiting up to `timeout` for one)."""
        if self._unsubmitted:
            self._flush()
        out = self._collect_done()
        if not out and timeout > 0 and self.busy():
            time.sleep(timeout)  # jobs finish on their own; nothing here to block on
            out = self._collect_done()
        self._note_started()
        return out

    def _note_started(self) -> None:
        """A job that has left the queue: its trial's clock starts here (module docstring); the scheduler checks the
        time limits after each poll. submitit caches the states it reads from sacct, so asking costs no call each poll."""
        for worker in self.workers:
            if worker.job is None or worker.task is None or worker.ready:
                continue
            if _state(worker.job) not in _QUEUED:
                worker.ready = True
                worker.clock_from = worker.clock()

    def _collect_done(self) -> list[Finished | Crashed]:
        out: list[Finished | Crashed] = []
        for worker in self.workers:
            if worker.job is None or worker.task is None or not worker.job.done():
                continue
            job, task = worker.job, worker.task
            worker.job = worker.task = None
            if self.settings.cluster == "local":
                job._results_timeout_s = 0  # a local file is there or not: no network file system to wait for
            try:
                message = job.result()
            except self._uncompleted as error:  # FailedJobError included
                state = _state(job)
                self._end(job.job_id, "failed", state)
                out.append(Crashed(worker, task, worker.stop_reason or f"Slurm job {job.job_id} ended without a result ({state}): {_first_line(error)}",
                                   environment=worker.stop_reason is None and state in OUTSIDE_STATES))
                continue
            self._end(job.job_id, "done", "COMPLETED")
            out.append(Finished(worker, task, message))
        return out

    def _end(self, job_id: str, state: JobState, detail: str) -> None:
        record = self._records[job_id]
        record.state, record.detail = state, detail
        self._ended.append(job_id)

    # -- status ---------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        """The active jobs (states refreshed: queued -> running) and those that ended since the last call."""
        ids = []
        for worker in self.workers:
            if worker.job is not None and worker.task is not None:
                record = self._records[worker.job.job_id]
                record.detail = _state(worker.job)
                record.state = "queued" if record.detail in _QUEUED else "running"
                ids.append(worker.job.job_id)
        ids += self._ended
        self._ended = []
        return [JobInfo(job_id=i, lane=r.lane, worker=r.worker, trial_ids=r.trial_ids, state=r.state, detail=r.detail) for i in ids for r in [self._records[i]]]

    def cancel_jobs(self, job_ids: Sequence[str]) -> None:
        """scancel what a killed run left (local jobs of a dead scheduler just finish: nobody reads them)."""
        if job_ids and self.settings.cluster == "slurm":
            subprocess.run(["scancel", *job_ids], check=False, capture_output=True)

    def pids(self) -> list[int]:
        return []


OUTSIDE_STATES = frozenset({"CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"})
"""Slurm's words for a job the cluster or a person ended (scancel, a lost node, preemption): the environment's doing, no
attempt spent. FAILED, OUT_OF_MEMORY and TIMEOUT are the trial's own."""


def _state(job: Any) -> str:
    """The cluster's word for a job's state ("FINISHED" locally once its process ended)."""
    try:
        state = str(job.state).upper()
    except Exception:  # noqa: BLE001 - sacct hiccups: report it, the next poll asks again
        return "UNKNOWN"
    return state.split()[0] if state else "UNKNOWN"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
