"""One checklist every executor passes: local processes, inline, Ray, Slurm through submitit's local cluster, and
`ThreadExecutor`, a toy written here against the typed messages alone (campaign/policy/messages.py) to show that a
new executor needs nothing else. Each runs the same campaign: every trial done once with the local executor's
metrics bit for bit, every task's end an `Outcome` for each of its trials (or handed back), a re-run with nothing left.
"""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufill.campaign.executors.base import Crashed, Finished, LaneRequest, NoBatchJobs, Slots, Worker
from gpufill.campaign.executors.local import plan_here
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Ready, Task, TaskEnded
from gpufill.campaign.run.runner import Campaign, read_results
from tests.helpers import write_campaign
from tests.shared_runs import shared_folder

METRICS = ["mae", "rmse", "smape", "mase"]


@dataclass(slots=True)
class ThreadExecutor(Slots, NoBatchJobs):
    """A toy executor: each lane's TrialRunner in this process, one task at a time on a background thread; `poll`
    collects what finished. It reports no progress (as a Ray call or a Slurm job): only each task's end."""

    spec_payload: dict[str, Any]
    base_dir: str
    workers: list[Worker] = field(default_factory=list)
    runners: dict[str, Any] = field(default_factory=dict)
    pool: concurrent.futures.ThreadPoolExecutor = field(default_factory=lambda: concurrent.futures.ThreadPoolExecutor(max_workers=1))
    running: dict[concurrent.futures.Future, Worker] = field(default_factory=dict)

    def plan(self, request: LaneRequest) -> tuple[list[Lane], list[str]]:
        return plan_here(request)

    def hand_data(self, projects: Any) -> None:
        return None  # its runners read the file, as a Ray actor's or a Slurm job's do

    def warm(self, lanes: list[Lane], check: Any = None) -> None:
        return None

    def start(self, lanes: list[Lane]) -> None:
        from gpufill.campaign.worker.worker import TrialRunner

        for lane in lanes:
            self.runners[lane.name] = TrialRunner(self.spec_payload, Path(self.base_dir), threads=lane.threads, device=lane.device)
            for slot in range(lane.slots):
                worker = Worker(name=f"{lane.name}-{slot + 1}", lane=lane)
                worker.note(Ready(pid=0))
                self.workers.append(worker)

    def submit(self, worker: Worker, task: Task) -> None:
        worker.begin(task)
        self.running[self.pool.submit(self._run, worker.lane, task)] = worker

    def _run(self, lane: Lane, task: Task) -> TaskEnded:
        from gpufill.forecasting.run import use_threads

        use_threads(lane.threads)
        return self.runners[lane.name].run_task(task)

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        done, _ = concurrent.futures.wait(list(self.running), timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        out: list[Finished | Crashed] = []
        for future in done:
            worker = self.running.pop(future)
            task, worker.task = worker.task, None
            assert task is not None
            error = future.exception()
            out.append(Crashed(worker, task, f"the task raised {error!r}") if error is not None else Finished(worker, task, future.result()))
        return out

    def stop(self, worker: Worker, reason: str) -> None:
        worker.stop_reason = reason

    def pids(self) -> list[int]:
        return []

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self.workers.clear()


class Watched:
    """An executor whose every Finished is kept, to check the messages it carried."""

    def __init__(self, inner: Any):
        self.inner, self.finished = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def poll(self, timeout: float) -> list[Finished | Crashed]:
        out = self.inner.poll(timeout)
        self.finished.extend(f for f in out if isinstance(f, Finished))
        return out


def suite_campaign(folder: Path, extra: str = "") -> Path:
    """Two network shapes and a classical family on two projects, packs of 2 pinned (so runs compare bit for bit)."""
    path = write_campaign(folder, models="mlp: {hidden_size: [8, 16]}\n  linear: {}")
    path.write_text(path.read_text().replace("resources: {retries: 1}", "resources: {retries: 1, pack_size: 2" + extra + "}"))
    return path


def _run_locally(folder: Path) -> None:
    assert Campaign.from_yaml(suite_campaign(folder), folder / "work").run().done == 6


@pytest.fixture
def reference(tmp_path_factory):
    return read_results(shared_folder(tmp_path_factory, "executor-suite-local", _run_locally) / "work").set_index("trial_id")


def _executor(kind: str, campaign: Campaign) -> Any:
    if kind == "toy":
        return ThreadExecutor(spec_payload=campaign.spec.model_dump(mode="json"), base_dir=str(campaign.base_dir))
    from gpufill.campaign.executors import make_executor

    return make_executor(kind, spec=campaign.spec, base_dir=str(campaign.base_dir), workdir=campaign.workdir)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "inline", "toy", "ray", "slurm"])
def test_every_executor_runs_the_campaign_as_the_local_one_does(tmp_path, reference, kind):
    saved = dict(os.environ)
    if kind == "ray":
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    if kind == "slurm":
        pytest.importorskip("submitit")
    try:
        path = suite_campaign(tmp_path)
        if kind == "slurm":
            text = path.read_text()
            path.write_text(text.replace("resources: {retries: 1, pack_size: 2}",
                                         "resources:\n  retries: 1\n  pack_size: 2\n  slurm: {cluster: local, gpus_per_job: 0, timeout_min: 10}"))
        campaign = Campaign.from_yaml(path, tmp_path / "work")
        watched = Watched(_executor(kind, campaign))
        outcome = campaign.run(executor=watched)
        assert (outcome.done, outcome.failed, outcome.crashed) == (6, 0, 0)
        results = campaign.results().set_index("trial_id")
        assert sorted(results.index) == sorted(reference.index) and (results["attempts"] == 1).all()
        assert results.loc[reference.index, METRICS].equals(reference[METRICS])  # bit for bit, networks included
        for finished in watched.finished:  # the protocol: a task's end has an outcome for each of its trials, or hands it back
            assert isinstance(finished.message, TaskEnded)
            ended = [o.trial_id for o in finished.message.outcomes] + list(finished.message.returned)
            assert sorted(ended) == sorted(t.trial_id for t in finished.task.trials)
        assert sum(o.ok for f in watched.finished for o in f.message.outcomes) == 6
        assert campaign.run(executor=_executor(kind, campaign)).done == 0  # a re-run resumes: nothing left
    finally:
        if kind == "ray":
            ray.shutdown()
            os.environ.clear()
            os.environ.update(saved)  # ray.init sets RAY_* and PYTHONBREAKPOINT
