"""The epoch loop of every training: one model (`fit`), a campaign's fused pack, `fit_many`'s variants.

A training is K rows stepped together (K = 1 for `fit`). Each epoch the loop asks its `Rows` for the epoch's steps
(at most what max_steps leaves) and, when due, a validation; `Stopping` judges each row still training (diverged,
early-stopped, cut by max_steps), the best weights are kept, the rows' watchers may prune, and the loop ends when no
row trains or the epochs or steps run out. What differs between trainings stays in their `Rows`: the step and where
its batches come from, checkpoints and progress lines (`fit`), masking and re-forming a pack.

The stop rules, one set for one model and for a pack of K: after every epoch the loop hands `Stopping` the rows'
losses; per row still training it decides, in this order: diverged (a loss not finite), early-stopped (no validation
better than the best by `min_delta` for `patience` validations), pruned (a watcher's reason: a search's pruner), or
cut by `max_steps`. A stopped row is no longer stepped (a pack masks it; `fit` ends). `BestWeights` keeps each row's
weights of its best validation and puts them back at the end (`restore_best`), never a diverged row's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from gpufill.engine.config import FitConfig
from gpufill.engine.result import EpochRecord, Status

PACK_NOTE = "masked, the rest of the pack went on"
"""What a pack's row says when it stops: the pack's other rows train on."""


@dataclass(frozen=True, slots=True)
class Rules:
    """The stop settings of FitConfig, as the loop reads them."""

    epochs: int
    max_steps: int | None
    patience: int | None
    min_delta: float
    validate_every: int
    restore_best: bool

    @classmethod
    def of(cls, cfg: FitConfig) -> Rules:
        return cls(cfg.epochs, cfg.max_steps, cfg.patience, cfg.min_delta, cfg.validate_every, cfg.restore_best)


class Stopping:
    """Each row's early-stopping count, best validation, status and events; the training's optimizer steps."""

    def __init__(self, k: int, rules: Rules, *, packed: bool, events: list[list[str]] | None = None):
        """`events`: each row's list to say its stops in (default: new lists)."""
        self.k, self.rules, self.packed = k, rules, packed
        self.best_val = [math.inf] * k
        self.best_epoch: list[int | None] = [None] * k
        self.bad = [0] * k
        self.status: list[Status] = ["completed"] * k
        self.events: list[list[str]] = events if events is not None else [[] for _ in range(k)]
        self.improved: list[int] = []
        """The rows whose validation was their best at the last judged epoch: BestWeights keeps these."""
        self.steps = [0] * k
        """Each row's optimizer steps (max_steps counts from the first; a pack's shorter members take fewer per epoch)."""

    # -- the epoch's bounds -------------------------------------------------------------------
    def steps_left(self) -> list[int] | None:
        """Each row's steps before max_steps (None: no limit)."""
        return None if self.rules.max_steps is None else [max(0, self.rules.max_steps - taken) for taken in self.steps]

    def count(self, rows: Sequence[int], steps: Sequence[int]) -> None:
        """`rows` took steps[i] steps each."""
        for i in rows:
            self.steps[i] += steps[i]

    def out_of_steps(self, i: int) -> bool:
        return self.rules.max_steps is not None and self.steps[i] >= self.rules.max_steps

    def ends(self, epoch: int, i: int) -> bool:
        """After `epoch`'s steps: row i's last epoch, or its max_steps reached."""
        return epoch == self.rules.epochs or self.out_of_steps(i)

    def validates(self, epoch: int, i: int) -> bool:
        return epoch % self.rules.validate_every == 0 or self.ends(epoch, i)

    @property
    def training(self) -> list[int]:
        """The rows still stepping: not stopped, steps left."""
        return [i for i, status in enumerate(self.status) if status == "completed" and not self.out_of_steps(i)]

    # -- the verdicts -------------------------------------------------------------------------
    def judge(self, epoch: int, train_loss: Sequence[float], val_loss: Sequence[float] | None, *, rows: Sequence[int],
              steps: Sequence[int], finite: Sequence[bool] | None = None) -> None:
        """`rows` trained `epoch` (`steps` of it each; their losses by row): each diverged, early-stopped, cut by
        max_steps, or going on. `finite`: whether each row's every step had a finite loss (a pack leaves a non-finite
        step out of its mean)."""
        self.improved = []
        for i in rows:
            val = None if val_loss is None or not self.validates(epoch, i) else val_loss[i]
            bad = [v for v in (train_loss[i], val) if v is not None and not math.isfinite(v)]
            if bad or (finite is not None and not finite[i]):
                self._stop(i, "diverged", f"diverged at epoch {epoch}: loss is {bad[0] if bad else 'not finite in a step'}")
            elif val is not None and self._no_better(i, val, epoch):
                self._stop(i, "early_stopped", f"early stop at epoch {epoch}: no improvement for {self.rules.patience} validations")
            elif self.out_of_steps(i) and epoch < self.rules.epochs:
                self.events[i].append(f"stopped at max_steps {self.rules.max_steps} in epoch {epoch} ({steps[i]} of its steps)")

    def prune(self, epoch: int, reasons: dict[int, str]) -> None:
        """Rows a watcher stops at `epoch` (status "pruned")."""
        for i, reason in reasons.items():
            if self.status[i] == "completed":
                self._stop(i, "pruned", f"pruned at epoch {epoch}: {reason}")

    def _no_better(self, i: int, val: float, epoch: int) -> bool:
        if val < self.best_val[i] - self.rules.min_delta:
            self.best_val[i], self.best_epoch[i], self.bad[i] = val, epoch, 0
            self.improved.append(i)
            return False
        self.bad[i] += 1
        return self.rules.patience is not None and self.bad[i] >= self.rules.patience

    def _stop(self, i: int, status: Status, event: str) -> None:
        self.status[i] = status
        self.events[i].append(f"{event}; {PACK_NOTE}" if self.packed else event)

    def row_metrics(self, i: int, history: Sequence[EpochRecord]) -> dict[str, float | int | None]:
        """Row i's `FitResult.metrics`: its last train loss, best validation loss and epoch, epochs run, and the loss's
        other outputs (train_<name> of the last epoch, val_<name> of the best, else of the last validated)."""
        metrics: dict[str, float | int | None] = {
            "train_loss": history[-1].train_loss if history else None,
            "val_loss": self.best_val[i] if self.best_epoch[i] is not None else None,
            "best_epoch": self.best_epoch[i],
            "epochs_run": len(history),
        }
        if history:
            metrics.update({f"train_{name}": value for name, value in history[-1].train_metrics.items()})
            best = next((r for r in history if r.epoch == self.best_epoch[i]), None)
            scored = best or next((r for r in reversed(history) if r.val_metrics is not None), None)
            if scored is not None and scored.val_metrics:
                metrics.update({f"val_{name}": value for name, value in scored.val_metrics.items()})
        return metrics

    def restore_best(self, weights: BestWeights) -> None:
        """At the end: the kept best weights back into the rows restore_best asks for (a best validation kept, not
        diverged), each row saying so."""
        if not self.rules.restore_best:
            return
        rows = [i for i in range(self.k) if self.best_epoch[i] is not None and self.status[i] != "diverged"]
        weights.restore(rows)
        for i in rows:
            self.events[i].append(f"restored the best weights (epoch {self.best_epoch[i]}, val loss {self.best_val[i]:.6g})")


StateDict = dict[str, torch.Tensor]


class BestWeights:
    """Each row's weights (and buffers) at its best validation. Rows of one model (`stacked=False`): the state dict
    whole; of a pack: row i of every stacked tensor, copied with one index copy per tensor whatever the rows."""

    def __init__(self, state: Callable[[], StateDict], *, stacked: bool, kept: StateDict | None = None):
        self.state, self.stacked = state, stacked
        self.kept = kept
        """None until a row first improves (a one-model training's checkpoint saves it as it is)."""

    def keep(self, rows: Sequence[int], *, source: StateDict | None = None, at: Sequence[int] | None = None) -> None:
        """Copy `rows` of the current weights (of `source`, whose row j is row at[j] here: a re-formed pack's) into the kept."""
        if not rows:
            return
        if self.kept is None:
            self.kept = {name: tensor.detach().clone() for name, tensor in self.state().items()}
            if source is None and (not self.stacked or len(rows) == _rows(self.kept)):
                return  # the copy just made holds these rows' weights
        _copy_rows(self.kept, source if source is not None else self.state(), rows, at, stacked=self.stacked)

    def restore(self, rows: Sequence[int]) -> None:
        """Put the kept weights of `rows` back into the current ones."""
        if rows and self.kept is not None:
            _copy_rows(self.state(), self.kept, rows, None, stacked=self.stacked)


def _rows(state: StateDict) -> int:
    return next(iter(state.values())).shape[0] if state else 0


@torch.no_grad()
def _copy_rows(target: StateDict, source: StateDict, rows: Sequence[int], at: Sequence[int] | None, *, stacked: bool) -> None:
    """target[name][rows] = source[name][at or rows]: the whole tensor where every row is copied (or the model is one),
    else one index copy per tensor (64 models' best weights kept per epoch were 1,500 small copies, 9 % of the call)."""
    if not stacked or (at is None and len(rows) == _rows(target)):
        for name, tensor in target.items():
            tensor.copy_(source[name])
        return
    device = next(iter(target.values())).device
    into = torch.tensor(list(rows), dtype=torch.long, device=device)
    taken = into if at is None else torch.tensor([at.index(i) for i in rows], dtype=torch.long, device=device)
    for name, tensor in target.items():
        tensor.index_copy_(0, into, source[name].index_select(0, taken))


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
