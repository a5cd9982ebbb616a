"""The scheduler's per-lane queue: indexed by shape, oldest first, counts kept."""

from __future__ import annotations

from gpufill.campaign.queue import Queued, ShapeQueue
from gpufill.forecasting.trial import Trial


def queued(trial_id: str, shape: str) -> Queued:
    return Queued(Trial(trial_id=trial_id, project="p", family="mlp", kind="neural", params={}, train={}, seed=0, lookback=8, shape=shape), attempts=0)


def trials(*shapes: str) -> list[Queued]:
    return [queued(f"t{i}", shape) for i, shape in enumerate(shapes)]


def test_shapes_come_oldest_first_and_a_shape_gives_its_trials_in_order():
    queue = ShapeQueue(trials("a", "b", "a", "c", "b", "a"))
    assert (len(queue), list(queue.shapes())) == (6, ["a", "b", "c"])
    assert [t.trial_id for t in queue.take("a", 2)] == ["t0", "t2"]
    assert [t.trial_id for t in queue.take("a", 5)] == ["t5"]  # fewer left than asked
    assert not queue.has("a") and list(queue.shapes()) == ["b", "c"] and len(queue) == 3
    queue.append(queued("retry", "a"))  # a retried trial: its shape waits again, last
    assert list(queue.shapes()) == ["b", "c", "a"] and len(queue) == 4
    for shape in list(queue.shapes()):
        queue.take(shape, 10)
    assert not queue and len(queue) == 0


def test_taking_one_trial_of_36000_touches_only_its_shape():
    queue = ShapeQueue(trials(*(f"s{i % 200}" for i in range(36_000))))
    assert len(list(queue.shapes())) == 200
    first = queue.take("s199")[0]
    assert first.trial_id == "t199" and len(queue) == 35_999
