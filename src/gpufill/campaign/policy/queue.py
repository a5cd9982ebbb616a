"""A lane's waiting trials, indexed by shape: the scheduler's next task costs O(shapes), not O(trials).

A campaign of 36,000 trials has a few hundred shapes at most. Trials of one shape wait in campaign
order in their own deque; shapes are visited in the order they first arrived, so without a
preference the oldest shape goes first, as a scan of one list in campaign order would.

The queue keeps a waiting trial's id and nothing else (what its shape is, and whether that shape
fuses, is kept once per shape): the scheduler rebuilds a trial from the store when it sends it
(`Store.queued`), so 36,000 waiting trials cost about 3 MB, not 36,000 `Trial` objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from gpufill.forecasting.trial import GLOBAL_PROJECT, Trial


class Waiting(NamedTuple):
    """A trial as the queue takes it in (the store's rows give these): its id, its shape, its kind (which queue it
    waits in), and whether trials of its shape train together as fused packs (neural, and not global: a global
    model trains on every project at once)."""

    trial_id: str
    shape: str
    kind: str
    fusable: bool

    @classmethod
    def of(cls, trial: Trial) -> Waiting:
        return cls(trial.trial_id, trial.shape, trial.kind, fuses(trial.kind, trial.project))


def fuses(kind: str, project: str) -> bool:
    """Whether trials of this kind and project train together as fused packs: neural, and not global (a global model
    trains on every project at once)."""
    return kind == "neural" and project != GLOBAL_PROJECT


@dataclass(slots=True, eq=False)
class Queued:
    """A trial of this run sent to a worker (rebuilt from the store when sent), with its attempts so far (the store's
    count, kept in step)."""

    trial: Trial
    attempts: int

    @property
    def trial_id(self) -> str:
        return self.trial.trial_id

    @property
    def shape(self) -> str:
        return self.trial.shape

    def waiting(self) -> Waiting:
        """This trial as the queue takes it back (a retry, or one its worker did not begin)."""
        return Waiting.of(self.trial)


class ShapeQueue:
    def __init__(self, trials: Iterable[Waiting] = ()):
        self._by_shape: dict[str, deque[str]] = {}
        self._fusable: dict[str, bool] = {}
        self._count = 0
        for trial in trials:
            self.append(trial)

    def append(self, trial: Waiting) -> None:
        self._by_shape.setdefault(trial.shape, deque()).append(trial.trial_id)
        self._fusable[trial.shape] = trial.fusable
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

    def fusable(self, shape: str) -> bool:
        """Whether trials of `shape` train together as fused packs."""
        return self._fusable[shape]

    def count(self, shape: str) -> int:
        """Trials of `shape` waiting."""
        return len(self._by_shape.get(shape, ()))

    def take(self, shape: str, count: int = 1) -> list[str]:
        """The ids of up to `count` trials of `shape`, oldest first."""
        waiting = self._by_shape[shape]
        taken = [waiting.popleft() for _ in range(min(count, len(waiting)))]
        if not waiting:
            del self._by_shape[shape]  # visited shapes stay few: only those with trials waiting
        self._count -= len(taken)
        return taken
