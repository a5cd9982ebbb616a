"""Inline executor: every task runs in the scheduler's own process, one task at a time.

For a trial you want to step through (a breakpoint, a print, a profiler of this process sees it) and for tests whose
subject is not process isolation: no interpreter starts and nothing is imported twice. The lanes, slots and thread
counts are the local executor's, so a trial trains as a local worker would train it (the same seed, threads and
data) and its metrics are the same. What it gives up is what a separate process gives: a trial that ends the
interpreter (a segfault, `os._exit`) ends the run with it, a trial past its time limit cannot be stopped, and the
slots take turns instead of running at once.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpufill.campaign.executors.base import Crashed, Finished, LaneRequest, NoBatchJobs, Slots, Worker, WorkerSource
from gpufill.campaign.executors.local import plan_here
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Ready, Task

if TYPE_CHECKING:
    from gpufill.campaign.spec.build_check import BuildCheck


@dataclass(slots=True, eq=False)
class InlineWorker(Worker):
    reports_progress: ClassVar[bool] = True


@dataclass(slots=True)
class InlineExecutor(WorkerSource, Slots, NoBatchJobs):
    """Runs each submitted task inside `poll`, in submission order, with its lane's thread count."""

    workers: list[InlineWorker] = field(default_factory=list)
    runners: dict[str, Any] = field(default_factory=dict)
    """Each lane's TrialRunner (the campaign's data loaded once per lane, as a worker process loads it once)."""
    submitted: list[InlineWorker] = field(default_factory=list)
    threads_before: int | None = None
    """torch's thread count when the executor started: given back at shutdown."""

    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        return plan_here(request)

    def warm(self, lanes: list[Lane], check: BuildCheck | None = None) -> None:
        return None  # nothing to begin before `start`

    def start(self, lanes: list[Lane]) -> None:
        import torch

        from gpufill.campaign.worker.worker import TrialRunner

        self.threads_before = torch.get_num_threads()
        for lane in lanes:
            self.runners[lane.name] = TrialRunner(self.spec_payload, Path(self.base_dir), threads=lane.threads, device=lane.device,
                                                  tune_cache=self.tune_cache, projects=self.data)
            for slot in range(lane.slots):
                worker = InlineWorker(name=f"{lane.name}-{slot + 1}", lane=lane)
                worker.note(Ready(os.getpid()))
                self.workers.append(worker)

    def submit(self, worker: Worker, task: Task) -> None:
        assert isinstance(worker, InlineWorker)
        worker.begin(task)
        self.submitted.append(worker)

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        """Runs the task submitted first, to its end (`timeout` does not apply: the task holds this process)."""
        if not self.submitted:
            return []
        worker = self.submitted.pop(0)
        task = worker.task
        assert task is not None
        from gpufill.forecasting.run import use_threads

        use_threads(worker.lane.threads)
        runner = self.runners[worker.lane.name]
        runner.on_progress = worker.note  # which trials started and finished: a task that raises fails only those training
        try:
            message = runner.run_task(task)
        except Exception as error:  # noqa: BLE001 - a local worker would die of it: reported as its crash
            worker.task = None
            return [Crashed(worker, task, f"the task raised {type(error).__name__}: {error}\n{traceback.format_exc(limit=-3)}")]
        worker.task = None
        worker.last_seen = worker.clock()
        return [Finished(worker, task, message)]

    def stop(self, worker: Worker, reason: str) -> None:
        """A task in this process cannot be stopped from outside; it is only ever stopped between polls, when it has ended."""
        worker.stop_reason = reason

    def pids(self) -> list[int]:
        return [os.getpid()]  # the trials' memory is this process's

    def shutdown(self) -> None:
        self.workers.clear()
        self.submitted.clear()
        self.runners.clear()
        if self.threads_before is not None:
            from gpufill.forecasting.run import use_threads

            use_threads(self.threads_before)
