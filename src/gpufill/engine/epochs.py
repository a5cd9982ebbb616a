"""The epoch loop of every training: one model (`fit`), a campaign's fused pack, `fit_many`'s variants.

A training is K rows stepped together (K = 1 for `fit`). Each epoch the loop asks its `Rows` for the epoch's steps
(at most what max_steps leaves) and, when due, a validation; `Stopping` judges each row still training (diverged,
early-stopped, cut by max_steps), the best weights are kept, the rows' watchers may prune, and the loop ends when no
row trains or the epochs or steps run out. What differs between trainings stays in their `Rows`: the step and where
its batches come from, checkpoints and progress lines (`fit`), masking and re-forming a pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufill.engine.result import EpochRecord
from gpufill.engine.stopping import Stopping


@dataclass(frozen=True, slots=True)
class Trained:
    """One epoch of steps: each row's sample-weighted means (`loss` and the loss's metrics), indexed by row."""

    values: dict[str, Sequence[float]]
    samples: Sequence[int]
    """Samples each row trained on, by row (a cut last epoch: what it trained)."""
    steps: Sequence[int]
    """Optimizer steps each row took, by row."""
    seconds: float
    """Each row's share of the epoch's seconds."""
    finite: Sequence[bool] | None = None
    """Whether every step's loss was finite, by row (None: the epoch's mean says it)."""


class Rows(Protocol):
    """A training as the loop drives it."""

    has_validation: bool

    def train_epoch(self, epoch: int, steps_left: Sequence[int] | None) -> Trained:
        """One epoch's steps of the rows still training, row i at most steps_left[i] of them (None: no limit)."""
        ...
    def validate(self) -> dict[str, Sequence[float]]: ...
    def lrs(self) -> Sequence[float]: ...
    def keep_best(self, rows: Sequence[int]) -> None: ...
    def epoch_end(self, epoch: int, records: dict[int, EpochRecord], ending: set[int]) -> dict[int, str]:
        """The epoch judged: what the training does with it (a checkpoint, its callbacks), and a reason to prune each row
        still training that should stop here (its watchers, a pruner); `ending`: the rows whose training ends here
        anyway (never pruned)."""
        ...
    def after_epoch(self, epoch: int, last: bool) -> None:
        """The epoch settled (statuses final): mask stopped rows, say it, re-form."""
        ...


def run_epochs(rows: Rows, stopping: Stopping, histories: Sequence[list[EpochRecord]], *, first: int = 1) -> None:
    """Epochs `first`.. of `rows` (a resumed training's first is the one after its checkpoint), each row's records
    appended to its history."""
    for epoch in range(first, stopping.rules.epochs + 1):
        training = stopping.training
        if not training:
            break  # resumed after the last step
        trained = rows.train_epoch(epoch, stopping.steps_left())
        stopping.count(training, trained.steps)
        ending = {i for i in training if stopping.ends(epoch, i)}
        due = {i for i in training if stopping.validates(epoch, i)}
        validated = rows.validate() if rows.has_validation and due else None
        lrs = rows.lrs()
        records = {i: _record(epoch, i, trained, validated if i in due else None, lrs[i]) for i in training}
        for i, record in records.items():
            histories[i].append(record)
        stopping.judge(epoch, trained.values["loss"], None if validated is None else validated["loss"], rows=training,
                       steps=trained.steps, finite=trained.finite)
        rows.keep_best(stopping.improved)
        stopping.prune(epoch, rows.epoch_end(epoch, records, ending))
        last = epoch == stopping.rules.epochs or not stopping.training
        rows.after_epoch(epoch, last)
        if last:
            break


def _record(epoch: int, i: int, trained: Trained, validated: dict[str, Sequence[float]] | None, lr: float) -> EpochRecord:
    return EpochRecord(epoch=epoch, train_loss=trained.values["loss"][i], val_loss=None if validated is None else validated["loss"][i],
                       seconds=trained.seconds, lr=lr, train_metrics={name: v[i] for name, v in trained.values.items() if name != "loss"},
                       val_metrics=None if validated is None else {name: v[i] for name, v in validated.items() if name != "loss"},
                       samples=trained.samples[i], steps=trained.steps[i])
