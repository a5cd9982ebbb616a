"""What runs next on a lane, how many trials of it, and how they train together: the scheduler's decisions, as a
pure object.

`DispatchPolicy` reads the waiting trials (a lane's ShapeQueue), what the lane runs now and the shapes'
measured facts (admission.ShapeBook); it touches no store, executor or clock, so every rule here is tested
on plain values (tests/campaign/policy/test_policy.py). The scheduler (run/scheduler.py) gathers those values, takes
the trials the policy names and sends them with the policy's `PackOrder`; a worker runs the order as given
(campaign/worker/), the one choice left to it being a new shape's measured size (`PackOrder.split`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufill.campaign.policy.admission import Running, ShapeBook, admits
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import PackOrder
from gpufill.campaign.policy.queue import ShapeQueue

PROBE_PACK = 64
"""Trials sent together for a shape whose pack size is not measured yet: the largest size the worker
tries (engine.packs.size.CANDIDATE_SIZES; a literal here keeps torch out of the scheduler's imports)."""


@dataclass(frozen=True, slots=True)
class Pick:
    """The next task of a lane: `count` trials of `shape` (the queue gives them of one input width), trained as `order` says."""

    shape: str
    count: int
    order: PackOrder


class DispatchPolicy:
    def __init__(self, book: ShapeBook):
        self.book = book

    def running_size(self, lane: Lane, shape: str, trials: int) -> int:
        """Trials a task of `trials` trains at once before its worker says: its pack size, or all of it while measuring."""
        size = self.book.pack_size(lane.name, shape)
        return trials if size is None else min(size, trials)

    def next_task(self, lane: Lane, queue: ShapeQueue, last_shape: str | None, running: Sequence[Running],
                  contexts: Sequence[int | None]) -> Pick | None:
        """The next task for a worker of `lane` that last ran `last_shape`: that shape first if admissible, else the
        oldest admissible shape (a pass over the waiting shapes, never over the trials); None when nothing fits.
        `contexts`: each of the lane's worker processes' CUDA context bytes (every one holds its own, busy or idle)."""
        shapes = [last_shape] if last_shape is not None and queue.has(last_shape) else []
        for shape in [*shapes, *queue.shapes()]:
            if (lane.name, shape) in self.book.measuring:  # one worker measures a shape's pack size
                continue
            count = self.admitted_count(lane, queue, shape, running, contexts)
            if count:
                return Pick(shape, count, self.order(lane, queue, shape, count))
        return None

    def order(self, lane: Lane, queue: ShapeQueue, shape: str, count: int) -> PackOrder:
        """How `count` trials of `shape` train: one at a time where the shape does not fuse (classical, global) or a
        lone trial's shape is not measured yet (too few trials to weigh a measurement against); else as one pack of
        the measured size, or measured first (size None), weighed against the shape's `waiting` trials."""
        if not queue.fusable(shape):
            return PackOrder()
        size = self.book.pack_size(lane.name, shape)
        if size is None and count == 1:
            return PackOrder()
        return PackOrder(size, self.book.kind(lane.name, shape), self.book.reason(lane.name, shape), waiting=queue.count(shape))

    def admitted_count(self, lane: Lane, queue: ShapeQueue, shape: str, running: Sequence[Running], contexts: Sequence[int | None]) -> int:
        """How many trials of `shape` to send now (0: none fits beside what runs). A measured pack that
        does not fit is halved until it does; alone on the lane, at least one trial goes."""
        if not queue.fusable(shape):  # classical, or a global model (it trains on every project at once)
            return 1 if admits(lane, self.book, shape, 1, running, contexts) else 0
        size = self.book.pack_size(lane.name, shape)
        count = min(queue.packable(shape), PROBE_PACK if size is None else size)
        if size is None:
            return count if admits(lane, self.book, shape, count, running, contexts) else 0
        while count >= 1:
            if admits(lane, self.book, shape, count, running, contexts):
                return count
            count //= 2
        return 0 if running else 1
