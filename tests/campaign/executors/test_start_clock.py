"""A trial's time limit counts from when it can begin: a Ray actor's start-up and a Slurm job's queue wait are not its.

A loaded clean-clone CI failed `bench/executor_overhead.py --smoke`: a Ray actor took over a minute to import and
load the campaign, the first trial of the shape had finished on the other actor in 0.1 s (limit: the 60 s floor), and
the scheduler stopped the second actor's trial before it began. A fake `ray` module drives the executor here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpufill.campaign.executors import ray as ray_executor
from gpufill.campaign.executors.base import Finished
from gpufill.campaign.executors.ray import RayExecutor, RayWorker
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Task, TaskEnded


class FakeRay:
    """`ray.wait` and `ray.get` over refs that are plain strings: a ref is ready once it is in `done`."""

    class exceptions:  # noqa: N801  (the shape of ray.exceptions)
        RayActorError = RuntimeError
        RayError = Exception

    def __init__(self) -> None:
        self.done: set[str] = set()

    def wait(self, refs: list[str], num_returns: int = 1, timeout: float | None = None) -> tuple[list[str], list[str]]:
        ready = [ref for ref in refs if ref in self.done][:num_returns]
        return ready, [ref for ref in refs if ref not in ready]

    def get(self, ref: str) -> dict[str, Any]:
        return TaskEnded()


def test_a_trials_clock_starts_when_its_actor_has_started_not_when_it_was_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    ray, now = FakeRay(), [0.0]
    monkeypatch.setattr(ray_executor, "import_ray", lambda: ray)  # no real Ray: its import sets environment variables
    lane = Lane(name="cpu", slots=1, threads=1, device="cpu", kinds=("neural",), queue="cpu", memory_budget_bytes=None, reason="test")
    calls = iter(["result-1", "result-2"])
    actor = SimpleNamespace(run=SimpleNamespace(remote=lambda task: next(calls)))
    worker = RayWorker(name="cpu-1", lane=lane, actor=actor, pid_ref="pid-1", clock=lambda: now[0])
    executor = RayExecutor(spec_payload={}, base_dir=".", workers=[worker])
    task = Task((SimpleNamespace(shape="mlp-small", trial_id="t1"),))

    executor.submit(worker, task)
    assert worker.clock_from == 0.0 and not worker.ready
    now[0] = 90.0  # still importing: the limit must not be running
    assert executor.poll(timeout=0) == [] and worker.clock_from == 0.0 and not worker.ready
    ray.done.add("pid-1")  # the actor answered its pid call: start-up over, the trial begins now
    now[0] = 95.0
    assert executor.poll(timeout=0) == [] and worker.ready and worker.clock_from == 95.0

    ray.done.add("result-1")
    now[0] = 96.0
    finished = executor.poll(timeout=0)
    assert [type(f) for f in finished] == [Finished] and worker.task is None
    now[0] = 200.0  # a started actor's next task counts from its submit
    executor.submit(worker, task)
    now[0] = 230.0
    assert executor.poll(timeout=0) == [] and worker.clock_from == 200.0


def test_a_slurm_trials_clock_starts_when_its_job_leaves_the_queue(tmp_path) -> None:
    """A job waits in the cluster's queue for a node (minutes to hours): that wait is not the trial's time."""
    pytest.importorskip("submitit")
    from gpufill.campaign.executors.slurm import SlurmExecutor, SlurmWorker
    from gpufill.campaign.spec.spec import SlurmSpec

    now = [0.0]
    lane = Lane(name="cpu", slots=1, threads=1, device="cpu", kinds=("neural",), queue="cpu", memory_budget_bytes=None, reason="test")
    job = SimpleNamespace(job_id="77_0", state="PENDING", done=lambda: False)
    worker = SlurmWorker(name="cpu-1", lane=lane, clock=lambda: now[0])
    executor = SlurmExecutor(spec_payload={}, base_dir=str(tmp_path), folder=tmp_path / "slurm", settings=SlurmSpec(), name="x", workers=[worker])
    worker.begin(Task((SimpleNamespace(shape="mlp-small", trial_id="t1"),)))
    worker.job = job  # as _flush leaves it once submitted
    now[0] = 3600.0  # an hour in the queue
    assert executor.poll(timeout=0) == [] and worker.clock_from == 0.0 and not worker.ready
    job.state = "RUNNING"
    now[0] = 3700.0
    assert executor.poll(timeout=0) == [] and worker.ready and worker.clock_from == 3700.0


@pytest.mark.parametrize(("state", "outside"), [("CANCELLED by 1000", True), ("NODE_FAIL", True), ("PREEMPTED", True), ("FAILED", False),
                                                ("OUT_OF_MEMORY", False), ("TIMEOUT", False)])
def test_a_slurm_job_the_cluster_or_a_person_ended_is_the_environments_failure(tmp_path, state, outside) -> None:
    """scancel, a lost node, preemption: no attempt spent (the scheduler's environment path); the job's own failure is the trial's."""
    pytest.importorskip("submitit")
    from gpufill.campaign.executors.base import Crashed
    from gpufill.campaign.executors.slurm import SlurmExecutor, SlurmWorker, _Record
    from gpufill.campaign.spec.spec import SlurmSpec

    lane = Lane(name="cpu", slots=1, threads=1, device="cpu", kinds=("neural",), queue="cpu", memory_budget_bytes=None, reason="test")
    worker = SlurmWorker(name="cpu-1", lane=lane, clock=lambda: 0.0)
    executor = SlurmExecutor(spec_payload={}, base_dir=str(tmp_path), folder=tmp_path / "slurm", settings=SlurmSpec(), name="x", workers=[worker])

    def result() -> None:
        raise executor._uncompleted(f"Job 77_0 ended: {state}")

    worker.begin(Task((SimpleNamespace(shape="mlp-small", trial_id="t1"),)))
    worker.job = SimpleNamespace(job_id="77_0", state=state, done=lambda: True, result=result)
    executor._records["77_0"] = _Record(lane="cpu", worker="cpu-1", trial_ids=("t1",))
    (crashed,) = executor.poll(timeout=0)
    assert isinstance(crashed, Crashed) and crashed.environment is outside and state.split()[0] in crashed.reason


@pytest.mark.parametrize(("error", "outside"), [(RuntimeError("The actor died unexpectedly before finishing this task."), True),
                                                (Exception("run_task raised"), False)])
def test_a_ray_actor_that_died_is_the_environments_failure_and_a_failed_task_the_trials(monkeypatch, error, outside) -> None:
    ray = FakeRay()
    ray.kill = lambda actor, no_restart: None

    def get(ref: str) -> dict[str, Any]:
        raise error

    ray.get = get
    monkeypatch.setattr(ray_executor, "import_ray", lambda: ray)
    lane = Lane(name="cpu", slots=1, threads=1, device="cpu", kinds=("neural",), queue="cpu", memory_budget_bytes=None, reason="test")
    actor = SimpleNamespace(run=SimpleNamespace(remote=lambda task: "result-1"))
    worker = RayWorker(name="cpu-1", lane=lane, actor=actor, pid_ref="pid-1", clock=lambda: 0.0)
    executor = RayExecutor(spec_payload={}, base_dir=".", workers=[worker])
    monkeypatch.setattr(executor, "_spawn", lambda lane: RayWorker(name="cpu-2", lane=lane, actor=actor, pid_ref="pid-2", clock=lambda: 0.0))
    executor.submit(worker, Task((SimpleNamespace(shape="mlp-small", trial_id="t1"),)))
    ray.done.update({"pid-1", "result-1"})
    (crashed,) = executor.poll(timeout=0)
    assert crashed.environment is outside and [w.name for w in executor.workers] == ["cpu-2"]
