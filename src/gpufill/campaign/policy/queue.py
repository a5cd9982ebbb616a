"""A lane's waiting trials, indexed by shape: the scheduler's next task costs O(shapes), not O(trials).

A campaign of 36,000 trials has a few hundred shapes at most. Trials of one shape wait in campaign
order in their own deque; shapes are visited in the order they first arrived, so without a
preference the oldest shape goes first, as a scan of one list in campaign order would.

Only trials whose networks take inputs of one width (the target and the project's covariates) fuse, so a
fusable shape's trials wait per input width: a take gives trials of one width, the oldest first. Which trials
train together is decided here and in the policy (policy.py), never by a worker.

The queue keeps a waiting trial's id and nothing else (what its shape is, and whether that shape
fuses, is kept once per shape): the scheduler rebuilds a trial from the store when it sends it
(`Store.queued`), so 36,000 waiting trials cost about 3 MB, not 36,000 `Trial` objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gpufill.forecasting.trial import GLOBAL_PROJECT, Trial


class Waiting(NamedTuple):
    """A trial as the queue takes it in (the store's rows give these): its id, its shape, its kind (which queue it
    waits in), whether trials of its shape train together as fused packs (neural, and not global: a global
    model trains on every project at once), and its project (whose input width it fuses at)."""

    trial_id: str
    shape: str
    kind: str
    fusable: bool
    project: str = ""

    @classmethod
    def of(cls, trial: Trial) -> Waiting:
        return cls(trial.trial_id, trial.shape, trial.kind, fuses(trial.kind, trial.project), trial.project)


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
    def __init__(self, trials: Iterable[Waiting] = (), *, widths: Mapping[str, int] | None = None):
        """`widths`: project -> its networks' input width (the target and its covariates: `Project.width`); a
        project not in it fuses with the others not in it."""
        self._by_shape: dict[str, dict[int, deque[str]]] = {}
        """shape -> input width (0 for a shape that does not fuse) -> waiting ids, campaign order."""
        self._fusable: dict[str, bool] = {}
        self._widths = dict(widths or {})
        self._count = 0
        for trial in trials:
            self.append(trial)

    def append(self, trial: Waiting) -> None:
        width = self._widths.get(trial.project, 0) if trial.fusable else 0
        self._by_shape.setdefault(trial.shape, {}).setdefault(width, deque()).append(trial.trial_id)
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
        """Trials of `shape` waiting, at any input width."""
        return sum(map(len, self._by_shape.get(shape, {}).values()))

    def packable(self, shape: str) -> int:
        """Trials of `shape` that may go in the next task together: those of the oldest input width."""
        widths = self._by_shape.get(shape)
        return len(next(iter(widths.values()))) if widths else 0

    def take(self, shape: str, count: int = 1) -> list[str]:
        """The ids of up to `count` trials of `shape`, oldest first, all of one input width (the oldest's)."""
        widths = self._by_shape[shape]
        width, waiting = next(iter(widths.items()))
        taken = [waiting.popleft() for _ in range(min(count, len(waiting)))]
        if not waiting:
            del widths[width]
            if not widths:
                del self._by_shape[shape]  # visited shapes stay few: only those with trials waiting
        self._count -= len(taken)
        return taken
