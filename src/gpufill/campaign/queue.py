"""A lane's waiting trials, indexed by shape: the scheduler's next task costs O(shapes), not O(trials).

A campaign of 36,000 trials has a few hundred shapes at most. Trials of one shape wait in campaign
order in their own deque; shapes are visited in the order they first arrived, so without a
preference the oldest shape goes first, as a scan of one list in campaign order would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpufill.forecasting.trial import Trial


@dataclass(slots=True, eq=False)
class Queued:
    """A trial of this run, waiting or running, with its attempts so far (the store's count, kept in step)."""

    trial: Trial
    attempts: int

    @property
    def trial_id(self) -> str:
        return self.trial.trial_id

    @property
    def shape(self) -> str:
        return self.trial.shape


class ShapeQueue:
    def __init__(self, trials: Iterable[Queued] = ()):
        self._by_shape: dict[str, deque[Queued]] = {}
        self._count = 0
        for trial in trials:
            self.append(trial)

    def append(self, trial: Queued) -> None:
        self._by_shape.setdefault(trial.shape, deque()).append(trial)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def shapes(self) -> Iterator[str]:
        """Shapes with trials waiting, oldest first."""
        return iter(list(self._by_shape))

    def has(self, shape: str | None) -> bool:
        return shape in self._by_shape

    def peek(self, shape: str) -> Queued:
        """The oldest trial of `shape`, left in place."""
        return self._by_shape[shape][0]

    def count(self, shape: str) -> int:
        """Trials of `shape` waiting."""
        return len(self._by_shape.get(shape, ()))

    def take(self, shape: str, count: int = 1) -> list[Queued]:
        """Up to `count` trials of `shape`, oldest first."""
        waiting = self._by_shape[shape]
        taken = [waiting.popleft() for _ in range(min(count, len(waiting)))]
        if not waiting:
            del self._by_shape[shape]  # visited shapes stay few: only those with trials waiting
        self._count -= len(taken)
        return taken
