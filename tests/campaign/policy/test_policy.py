"""campaign/policy/policy.py: what runs next and how many trials of it, decided on plain values (no store, executor or clock)."""

from __future__ import annotations

import dataclasses

from gpufill.campaign.policy.admission import Running, ShapeBook, ShapeFact
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import PackOrder
from gpufill.campaign.policy.policy import PROBE_PACK, DispatchPolicy, Pick
from gpufill.campaign.policy.queue import ShapeQueue, Waiting
from tests.helpers import a_trial

GIB = 2**30
GPU = Lane(name="gpu", slots=4, threads=1, device="cuda:0", kinds=("neural",), queue="gpu", memory_budget_bytes=10 * GIB, reason="test")
CPU = Lane(name="cpu", slots=2, threads=1, device="cpu", kinds=("classical",), queue="cpu", memory_budget_bytes=None, reason="test")


def queue_of(*shapes: str, kind: str = "neural", project: str = "p0") -> ShapeQueue:
    return ShapeQueue(Waiting.of(a_trial(f"t{i}", shape=shape, kind=kind, project=project)) for i, shape in enumerate(shapes))


def test_the_last_shape_goes_first_then_the_oldest():
    book = ShapeBook({("cpu", "a"): ShapeFact(pack_size=1), ("cpu", "b"): ShapeFact(pack_size=1)})
    queue = queue_of("a", "b", "a", kind="classical")
    policy = DispatchPolicy(book)
    assert policy.next_task(CPU, queue, "b", [], []) == Pick("b", 1, PackOrder())
    assert policy.next_task(CPU, queue, None, [], []) == Pick("a", 1, PackOrder())  # classical trials go one at a time
    assert policy.next_task(CPU, ShapeQueue(), "a", [], []) is None


def test_an_unmeasured_shape_is_sent_whole_to_one_worker_and_skipped_while_measured():
    queue = queue_of(*["new"] * 100)
    book = ShapeBook()
    policy = DispatchPolicy(book)
    # The worker measures its pack size, weighing it against the shape's 100 waiting trials
    assert policy.next_task(GPU, queue, None, [], []) == Pick("new", PROBE_PACK, PackOrder(None, waiting=100))
    book.measuring.add(("gpu", "new"))
    assert policy.next_task(GPU, queue, None, [], []) is None  # nobody else measures it meanwhile
    assert policy.next_task(GPU, queue, None, [Running("other", 1)], []) is None  # unmeasured beside an unmeasured task: waits


def test_a_measured_pack_that_does_not_fit_is_halved_until_it_does():
    book = ShapeBook({("gpu", "big"): ShapeFact(pack_size=8, peak_bytes={1: GIB, 2: 2 * GIB, 4: 4 * GIB, 8: 8 * GIB})})
    policy = DispatchPolicy(book)
    queue = queue_of(*["big"] * 20)
    assert policy.admitted_count(GPU, queue, "big", [], [GIB]) == 8  # 1 GiB context + 8 GiB pack <= 10 GiB
    assert policy.admitted_count(GPU, queue, "big", [Running("big", 4)], [GIB] * 3) == 2  # contexts 3 + running 4 + a pack of 2: 2 <= 10; of 4 would be 11
    assert policy.admitted_count(GPU, queue, "big", [Running("big", 8)], [GIB, GIB]) == 0  # nothing fits beside it
    assert policy.running_size(GPU, "big", 20) == 8 and policy.running_size(GPU, "unknown", 20) == 20


def test_a_global_trial_is_never_packed():
    book = ShapeBook({("gpu", "g"): ShapeFact(pack_size=8, peak_bytes={8: GIB})})
    queue = queue_of(*["g"] * 5, project="*")
    assert DispatchPolicy(book).next_task(GPU, queue, None, [], []) == Pick("g", 1, PackOrder())  # one at a time, no pack entry
    assert dataclasses.is_dataclass(Pick) and Pick.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_policy_hands_down_how_trials_train_together():
    """One owner for packing: the order names the size, kind and reason the book holds; a lone trial of a shape not
    measured yet trains alone (nothing to weigh a measurement against); a measured shape's task is at most one pack."""
    book = ShapeBook({("gpu", "known"): ShapeFact(pack_size=4, reason="measured: 4", kind="vmap")})
    policy = DispatchPolicy(book)
    assert policy.next_task(GPU, queue_of(*["known"] * 10), None, [], []) == Pick("known", 4, PackOrder(4, "vmap", "measured: 4", waiting=10))
    assert policy.next_task(GPU, queue_of("lone"), None, [], []) == Pick("lone", 1, PackOrder())
    fixed = DispatchPolicy(ShapeBook(fixed_pack_size=2))
    assert fixed.next_task(GPU, queue_of(*["any"] * 3), None, [], []) == Pick("any", 2, PackOrder(2, None, "resources.pack_size: 2", waiting=3))
    assert fixed.next_task(CPU, queue_of("lin", kind="classical"), None, [], []) == Pick("lin", 1, PackOrder())  # no pack entry for a classical trial


def test_only_trials_of_one_input_width_go_together():
    """Projects with other covariates give networks of another input width: the queue keeps them apart, so a task
    (a pack) holds one width, oldest width first, and the rest follow as their own packs."""
    trials = [Waiting.of(a_trial(f"t{i}", shape="s", kind="neural", project=project)) for i, project in enumerate(["a", "b", "a", "c", "b", "a"])]
    queue = ShapeQueue(trials, widths={"a": 1, "b": 3, "c": 1})
    policy = DispatchPolicy(ShapeBook({("gpu", "s"): ShapeFact(pack_size=8)}))
    assert (queue.count("s"), queue.packable("s")) == (6, 4)
    picks = []
    while (pick := policy.next_task(GPU, queue, None, [], [])) is not None:
        picks.append((pick.count, queue.take(pick.shape, pick.count), pick.order.waiting))
    assert picks == [(4, ["t0", "t2", "t3", "t5"], 6), (2, ["t1", "t4"], 2)]
