"""A search's pruner inside one network's training (campaign/spec/search_spec.py: `search.pruner`).

The scheduler sends each trial of a round the earlier rounds' trials of its project (each one's validation score
at the epochs it reported, and how it ended). `RungPruner` replays them through a fresh Optuna pruner in proposal
order (so ASHA's rungs hold exactly the values they held then), then reports this trial's validation score where
the pruner reads one and stops the training where it says so: as a fit callback for a trial alone, as
`PackMember.watch` for a pack's member (`PrunerWatch` makes either). The decisions read nothing of the trials
running beside it: a resumed search prunes the same trials at the same epochs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufill.campaign.spec.search_spec import PRUNERS
from gpufill.forecasting.run import EpochRecord, FitCallback, ValidationScorer

__all__ = ["PrunerWatch", "RungPruner", "make_pruner"]


def make_pruner(settings: Mapping[str, Any]) -> Any:
    """The Optuna pruner `settings` name (campaign/spec/search_spec.py: PRUNERS)."""
    from gpufill.campaign.trials.search import optuna_module

    return PRUNERS[settings["kind"]].build(optuna_module(), settings)


class RungPruner(FitCallback):
    """Reports `score()` (this trial's validation metric, lower is better) where the pruner reads one, and stops the
    training when the pruner, knowing only `history`, says so."""

    def __init__(self, settings: Mapping[str, Any], history: Sequence[Mapping[str, Any]], score: Callable[[], float]):
        self.settings, self.score = settings, score
        self.values: dict[int, float] = {}
        """epoch -> the validation score reported there: kept with the trial's result (what later rounds replay)."""
        self.pruned_at: int | None = None
        self._reason: str | None = None
        self._trial = _replayed(settings, history)

    def reports_at(self, epoch: int) -> bool:
        """ASHA reads a trial's score at its rungs only (min_epochs x reduction_factor^k): scoring the validation
        windows (a forward over them) there alone keeps the pruner's cost off the other epochs; the median rule reads
        every epoch from min_epochs on."""
        first = self.settings["min_epochs"]
        if epoch < first:
            return False
        if PRUNERS[self.settings["kind"]].every_epoch:
            return True
        rung = first
        while rung < epoch:
            rung *= self.settings["reduction_factor"]
        return rung == epoch

    def after_epoch(self, epoch: int) -> str | None:
        """Report this epoch's score where the pruner reads one; a reason to stop here, or None."""
        if not self.reports_at(epoch):
            return None
        value = float(self.score())
        if not math.isfinite(value):
            return None  # a diverging training ends on its own
        self.values[epoch] = value
        self._trial.report(value, epoch)
        if not self._trial.should_prune():
            return None
        self.pruned_at = epoch
        return (f"{PRUNERS[self.settings['kind']].label} stopped it: validation {self.settings['metric']} {value:.6g} among the worse at this epoch "
                "of the earlier rounds' trials")

    def on_epoch_end(self, record: EpochRecord) -> None:
        self._reason = self.after_epoch(record.epoch)

    def stop(self, record: EpochRecord) -> str | None:
        return self._reason


class PrunerWatch:
    """A search pruner for one trial's network (forecasting/run.py's Watch): it scores the model on its projects'
    validation windows (the search metric, in the data's units) and records what it saw with the trial's result."""

    def __init__(self, settings: Mapping[str, Any], history: Sequence[Mapping[str, Any]], windows: Sequence[Any]):
        self.settings, self.history, self.windows = settings, history, windows
        self.pruner: RungPruner | None = None

    def callbacks(self, model: Any) -> list[FitCallback]:
        scorer = ValidationScorer(self.windows, self.settings["metric"].removeprefix("val_"))
        self.pruner = RungPruner(self.settings, self.history, lambda: scorer(model))
        return [self.pruner]

    def member(self) -> Any:
        """The pruner for the trial trained in a pack: scored from the pack's predictions of its validation windows."""
        scorer = ValidationScorer(self.windows, self.settings["metric"].removeprefix("val_"))
        latest: list[Any] = [None]
        self.pruner = RungPruner(self.settings, self.history, lambda: scorer.score(latest[0]()))

        def watch(epoch: int, predictions: Any) -> str | None:
            latest[0] = predictions
            return self.pruner.after_epoch(epoch)

        return watch

    def metrics(self) -> dict[str, Any]:
        """{"rungs": {epoch: score}} (what later rounds replay) and, when it stopped the training, {"pruned": {epoch,
        metric: its score there}} (the trial's "val" is its best epoch's weights')."""
        if self.pruner is None:
            return {}
        found: dict[str, Any] = {"rungs": {str(epoch): value for epoch, value in self.pruner.values.items()}}
        if self.pruner.pruned_at is not None:
            found["pruned"] = {"epoch": self.pruner.pruned_at, self.settings["metric"]: self.pruner.values[self.pruner.pruned_at]}
        return found


def _replayed(settings: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Any:
    """A running Optuna trial of a study that has seen `history` in order, each trial's reports and pruning checks
    as they happened (ASHA records its rungs as trials pass them), then its end."""
    from gpufill.campaign.trials.search import optuna_module

    optuna = optuna_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction=settings["direction"], pruner=make_pruner(settings), sampler=optuna.samplers.RandomSampler(seed=0))
        for past in history:
            trial = study.ask()
            for epoch, value in sorted((int(e), float(v)) for e, v in past["values"].items()):
                trial.report(value, epoch)
                trial.should_prune()
            if past["state"] == "pruned" or past.get("value") is None:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, float(past["value"]))
        return study.ask()
