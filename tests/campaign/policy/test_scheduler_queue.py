"""The scheduler's per-lane queue: indexed by shape, oldest first, counts kept; a waiting trial is its id alone."""

from __future__ import annotations

import gc

import pytest

from gpufill.campaign.executors.base import Finished
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Outcome, TaskEnded
from gpufill.campaign.policy.queue import ShapeQueue, Waiting
from gpufill.campaign.run.scheduler import Scheduler
from gpufill.campaign.store.store import Store
from gpufill.forecasting.trial import Trial
from tests.fakes import FakeExecutor, done_result


def waiting(trial_id: str, shape: str) -> Waiting:
    return Waiting(trial_id, shape, "neural", True)


def trials(*shapes: str) -> list[Waiting]:
    return [waiting(f"t{i}", shape) for i, shape in enumerate(shapes)]


def test_shapes_come_oldest_first_and_a_shape_gives_its_trials_in_order():
    queue = ShapeQueue(trials("a", "b", "a", "c", "b", "a"))
    assert (len(queue), list(queue.shapes())) == (6, ["a", "b", "c"])
    assert queue.take("a", 2) == ["t0", "t2"]
    assert queue.take("a", 5) == ["t5"]  # fewer left than asked
    assert not queue.has("a") and list(queue.shapes()) == ["b", "c"] and len(queue) == 3
    queue.append(waiting("retry", "a"))  # a retried trial: its shape waits again, last
    assert list(queue.shapes()) == ["b", "c", "a"] and len(queue) == 4
    for shape in list(queue.shapes()):
        queue.take(shape, 10)
    assert not queue and len(queue) == 0


def test_whether_a_shape_fuses_is_kept_per_shape():
    queue = ShapeQueue([Waiting("t0", "mlp", "neural", True), Waiting("t1", "linear", "classical", False), Waiting("t2", "global", "neural", False)])
    assert [queue.fusable(shape) for shape in queue.shapes()] == [True, False, False]


def test_taking_one_trial_of_36000_touches_only_its_shape():
    queue = ShapeQueue(trials(*(f"s{i % 200}" for i in range(36_000))))
    assert len(list(queue.shapes())) == 200
    assert queue.take("s199") == ["t199"] and len(queue) == 35_999


class InstantExecutor(FakeExecutor):
    """Finishes every task at the next poll; notes what the scheduler holds when the workers start and at each task."""

    def __init__(self, scheduler_of):  # noqa: ANN001
        super().__init__()
        self.scheduler_of = scheduler_of
        self.trials_at_start = -1
        self.sent: list[list[str]] = []
        self.in_flight: list[int] = []

    def start(self, lanes) -> None:  # noqa: ANN001
        gc.collect()
        self.trials_at_start = sum(1 for o in gc.get_objects() if type(o) is Trial and o.trial_id.startswith("queued-"))
        super().start(lanes)

    def submit(self, worker, task) -> None:  # noqa: ANN001
        self.sent.append([t.trial_id for t in task.trials])
        self.in_flight.append(len(self.scheduler_of().tracked))
        worker.begin(task)

    def poll(self, timeout):  # noqa: ANN001, ANN201
        out = []
        for worker in self.busy():
            task, worker.task = worker.task, None
            outcomes = tuple(Outcome(trial_id=t.trial_id, ok=True, result=done_result({})) for t in task.trials)
            out.append(Finished(worker, task, TaskEnded(outcomes)))
        return out


@pytest.mark.slow
def test_the_scheduler_holds_waiting_trials_as_ids_and_sends_them_in_campaign_order_by_shape(tmp_path):
    """No Trial object per waiting trial (3,000 here; 36,000 in bench/campaign_scale.py): only those sent are rebuilt
    from the store, and each is let go once recorded; the order is the queue's (each shape's trials in campaign order)."""
    shapes = [f"linear[lookback={8 + i % 5}]" for i in range(3000)]
    store = Store.create(tmp_path)
    store.sync_trials([Trial(trial_id=f"queued-{i:04d}", project=f"p{i // 5}", family="linear", kind="classical", params={"alpha": i % 5}, train={},
                             seed=0, lookback=8 + i % 5, shape=shape) for i, shape in enumerate(shapes)], {"classical": "cpu"})
    gc.collect()
    lane = Lane(name="cpu", slots=1, threads=1, device="cpu", kinds=("classical",), queue="cpu", memory_budget_bytes=None, reason="test")
    scheduler: list[Scheduler] = []
    executor = InstantExecutor(lambda: scheduler[0])
    scheduler.append(Scheduler(store, executor, [lane], retries=0, run_id=store.begin_run("test")))
    outcome = scheduler[0].run()
    assert outcome.done == 3000 and executor.trials_at_start == 0
    assert [trial_id for task in executor.sent for trial_id in task] == [f"queued-{i:04d}" for shape in dict.fromkeys(shapes) for i in range(3000)
                                                                        if shapes[i] == shape]
    assert max(executor.in_flight) == 1 and not scheduler[0].tracked  # one task in flight at a time, nothing kept after it
    store.close()
