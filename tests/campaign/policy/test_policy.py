"""campaign/policy/policy.py: what runs next and how many trials of it, decided on plain values (no store, executor or clock)."""

from __future__ import annotations

import dataclasses

from gpufill.campaign.policy.admission import Running, ShapeBook, ShapeFact
from gpufill.campaign.policy.lanes import Lane
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
    assert policy.next_task(CPU, queue, "b", [], []) == Pick("b", 1, 1)
    assert policy.next_task(CPU, queue, None, [], []) == Pick("a", 1, 1)  # classical trials go one at a time
    assert policy.next_task(CPU, ShapeQueue(), "a", [], []) is None


def test_an_unmeasured_shape_is_sent_whole_to_one_worker_and_skipped_while_measured():
    queue = queue_of(*["new"] * 100)
    book = ShapeBook()
    policy = DispatchPolicy(book)
    assert policy.next_task(GPU, queue, None, [], []) == Pick("new", PROBE_PACK, None)  # the worker measures its pack size
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
    assert DispatchPolicy(book).next_task(GPU, queue, None, [], []) == Pick("g", 1, 8)
    assert dataclasses.is_dataclass(Pick) and Pick.__dataclass_params__.frozen  # type: ignore[attr-defined]
