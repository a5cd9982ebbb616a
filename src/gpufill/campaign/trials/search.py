"""A search campaign's proposals: Optuna's samplers over the families' grids, round by round (campaign/spec/search_spec.py).

Round r proposes `search.batch` configurations no earlier round proposed. Its sampler is made afresh, seeded by
(search.seed, r), and told every earlier configuration's validation score (the mean over its trials; a
configuration whose trials all failed is told as failed): the proposals are a function of the seed and the
stored results alone. So a resumed search replays its finished rounds from the store, proposes what the
interrupted one would have, and a proposal's trials keep their content-hash ids (campaign/trials/trials.py): a
round's trials that finished are never trained again.

A configuration's trials (every seed; local mode: every project) train together, packed by shape like a grid's.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufill.campaign.spec.search_spec import SAMPLERS, Range
from gpufill.campaign.trials.trials import Trial, canonical, expand_points
from gpufill.errors import InputError

if TYPE_CHECKING:
    import optuna

    from gpufill.campaign.spec.spec import CampaignSpec
    from gpufill.campaign.store.store import Store

__all__ = ["ASKS_PER_PROPOSAL", "Config", "Search", "optuna_module"]

log = logging.getLogger("gpufill.campaign")

ASKS_PER_PROPOSAL = 50
"""A round asks the sampler at most this many times per configuration it wants: in a small categorical space the
samplers repeat themselves, and a round that finds no new configuration in that many asks ends the search."""


def optuna_module() -> Any:
    """Optuna, or one line naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise InputError("search: needs Optuna, which is not installed", field="search",
                         fix="pip install 'gpufill[search]' (or pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True, slots=True)
class Config:
    """One proposed configuration: a family, its grid point and lookback, and the sampler's own names for them."""

    key: str
    """What makes two proposals the same configuration (canonical JSON of family, point and lookback)."""
    family: str = field(compare=False)
    point: dict[str, Any] = field(compare=False, hash=False)
    lookback: int = field(compare=False)
    params: dict[str, Any] = field(compare=False, hash=False)
    """What the sampler chose, by its parameter names (family, {family}.{key}, lookback): what it is told again."""


class Space:
    """The families' grids as Optuna distributions: a list of several values is a categorical choice (by index where
    a value is not a number, string, bool or None), a range a float or int distribution, one value fixed; the family
    and the lookback are choices where there are several."""

    def __init__(self, spec: CampaignSpec):
        optuna = optuna_module()
        self.spec = spec
        self.families = list(spec.models)
        self.distributions: dict[str, Any] = {}
        self.by_index: dict[str, list[Any]] = {}
        """name -> the values a categorical's indices stand for (values Optuna cannot hold, such as lists)."""
        if len(self.families) > 1:
            self._categorical("family", self.families)
        for family, axes in spec.models.items():
            for key, axis in axes.items():
                name = f"{family}.{key}"
                if isinstance(axis, Range):
                    step = None if axis.step is None else (int(axis.step) if axis.integer else axis.step)
                    self.distributions[name] = (optuna.distributions.IntDistribution(int(axis.low), int(axis.high), log=axis.log, step=step or 1)
                                                if axis.integer else optuna.distributions.FloatDistribution(axis.low, axis.high, log=axis.log, step=step))
                elif len(axis) > 1:
                    self._categorical(name, axis)
        if len(spec.task.lookback) > 1:
            self._categorical("lookback", list(spec.task.lookback))

    def _categorical(self, name: str, values: Sequence[Any]) -> None:
        import optuna

        plain = all(value is None or isinstance(value, bool | int | float | str) for value in values)
        if not plain:
            self.by_index[name] = list(values)
        self.distributions[name] = optuna.distributions.CategoricalDistribution(list(values) if plain else list(range(len(values))))

    def _choose(self, trial: optuna.Trial, name: str) -> Any:
        """The sampler's choice of `name`, as the grid's value."""
        import optuna

        found = self.distributions[name]
        if isinstance(found, optuna.distributions.CategoricalDistribution):
            chosen = trial.suggest_categorical(name, found.choices)
            return self.by_index[name][chosen] if name in self.by_index else chosen
        if isinstance(found, optuna.distributions.IntDistribution):
            return trial.suggest_int(name, found.low, found.high, step=found.step, log=found.log)
        return trial.suggest_float(name, found.low, found.high, step=found.step, log=found.log)

    def sample(self, trial: optuna.Trial) -> Config:
        """Ask `trial` for one configuration: the family first, then its own axes (a conditional space), then the
        lookback (a family that fits the whole series has one: `CampaignSpec.lookbacks`)."""
        family = self._choose(trial, "family") if "family" in self.distributions else self.families[0]
        point = {key: self._choose(trial, f"{family}.{key}") if f"{family}.{key}" in self.distributions else axis[0]
                 for key, axis in self.spec.models[family].items()}
        lookbacks = self.spec.lookbacks(family)
        lookback = self._choose(trial, "lookback") if len(lookbacks) > 1 else lookbacks[0]
        key = canonical({"family": family, "point": point, "lookback": lookback})
        return Config(key, family, point, int(lookback), dict(trial.params))


class Search:
    """The proposals of one search campaign, replayed from `store` and extended a round at a time."""

    def __init__(self, spec: CampaignSpec, fingerprints: Mapping[str, str], *, max_attempts: int):
        assert spec.search is not None
        self.spec, self.search = spec, spec.search
        self.fingerprints = dict(fingerprints)
        self.max_attempts = max_attempts
        self.space = Space(spec)
        self.rounds: list[list[tuple[Config, list[Trial]]]] = []
        self.exhausted = False

    @property
    def proposed(self) -> int:
        return sum(len(found) for found in self.rounds)

    def trials(self) -> list[Trial]:
        """Every proposed configuration's trials, in proposal order: what the store lists as the campaign's."""
        return [trial for found in self.rounds for _, trials in found for trial in trials]

    def advance(self, store: Store) -> bool:
        """Propose rounds until one has trials left to train (or the budget is spent): True when a round was added.
        A round whose trials all finished (a resumed search) is replayed from the store and the next proposed."""
        added = False
        while self.proposed < self.search.trials and not self.exhausted:
            if self.rounds and not self._settled(store, self.rounds[-1]):
                return added
            found = self._propose(store, len(self.rounds))
            if not found:
                self.exhausted = True
                log.info("search: the space holds no configuration not proposed already (%d proposed)", self.proposed)
                break
            self.rounds.append(found)
            added = True
        return added

    def first_round(self) -> list[Trial]:
        """The first round's proposals (no results needed): the sample of the space `gpufill estimate` times."""
        if not self.rounds:
            self.rounds.append(self._propose(None, 0))
        return [trial for _, trials in self.rounds[0] for trial in trials]

    # -- internals ---------------------------------------------------------------------------------

    def _rows(self, store: Store, trials: Sequence[Trial]) -> dict[str, dict[str, Any]]:
        return store.search_rows([t.trial_id for t in trials], self.spec.task.metric)

    def _settled(self, store: Store, found: Sequence[tuple[Config, list[Trial]]]) -> bool:
        """Whether every trial of the round is done, pruned, or failed with no attempt left."""
        trials = [t for _, listed in found for t in listed]
        rows = self._rows(store, trials)
        return len(rows) == len(trials) and all(
            row["status"] in ("done", "pruned") or (row["status"] == "failed" and row["attempts"] >= self.max_attempts) for row in rows.values())

    def _told(self, rows_of: Mapping[str, dict[str, Any]], trials: Sequence[Trial]) -> tuple[str, float | None, dict[int, float]]:
        """What the sampler is told of a configuration: ("complete", the mean validation score of its done trials)
        where any finished (local mode: a pruner stops each project's trial on its own), ("pruned", None, the mean
        score per epoch its trials reported) where a pruner stopped them all, else ("fail", None, {})."""
        rows = [rows_of[t.trial_id] for t in trials if t.trial_id in rows_of]
        scored = [row["val"] for row in rows if row["status"] == "done" and row["val"] is not None and np.isfinite(row["val"])]
        if scored:
            return "complete", float(np.mean(scored)), {}
        if any(row["status"] == "pruned" for row in rows):
            epochs: dict[int, list[float]] = {}
            for row in rows:
                for epoch, value in row["rungs"].items():
                    epochs.setdefault(int(epoch), []).append(float(value))
            return "pruned", None, {epoch: float(np.mean(values)) for epoch, values in sorted(epochs.items())}
        return "fail", None, {}

    def pruning(self, store: Store) -> dict[str, Any] | None:
        """What a worker's pruner needs for the newest round's trials (campaign/trials/pruning.py): the pruner's settings and,
        per project, the earlier rounds' trials in proposal order (their scores per epoch, how they ended); None
        without a pruner."""
        pruner = self.search.pruner
        if pruner.kind == "none":
            return None
        earlier = [t for found in self.rounds[:-1] for _, trials in found for t in trials if t.kind == "neural"]
        rows = self._rows(store, earlier)
        history: dict[str, list[dict[str, Any]]] = {}
        for trial in earlier:
            row = rows.get(trial.trial_id)
            if row is not None and row["status"] in ("done", "pruned") and row["rungs"]:
                history.setdefault(trial.project, []).append({"values": row["rungs"], "state": row["status"], "value": row["val"]})
        settings = {**pruner.model_dump(), "metric": self.spec.search_metric, "direction": self.search.direction}
        return {"settings": settings, "history": history}

    def _sampler(self, round_index: int) -> optuna.samplers.BaseSampler:
        seed = int(np.random.SeedSequence([self.search.seed, round_index]).generate_state(1)[0])
        return SAMPLERS[self.search.sampler].build(optuna_module(), seed, self.space.distributions)

    def _propose(self, store: Store | None, round_index: int) -> list[tuple[Config, list[Trial]]]:
        """Round `round_index`'s new configurations, the sampler told every earlier round's results (read from `store`;
        the first round reads nothing)."""
        optuna = optuna_module()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(direction=self.search.direction, sampler=self._sampler(round_index))
        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED, "fail": optuna.trial.TrialState.FAIL}
        known: dict[Config, tuple[str, float | None, dict[int, float]]] = {}
        rows = self._rows(store, self.trials()) if store is not None and self.rounds else {}  # every earlier trial, read once
        for found in self.rounds:
            for config, trials in found:
                known[config] = state, value, steps = self._told(rows, trials)
                distributions = {name: self.space.distributions[name] for name in config.params}
                study.add_trial(optuna.trial.create_trial(params=config.params, distributions=distributions, value=value, state=states[state],
                                                          intermediate_values=steps or None))
        wanted = min(self.search.batch, self.search.trials - self.proposed)
        new: list[Config] = []
        for _ in range(ASKS_PER_PROPOSAL * wanted):
            if len(new) == wanted:
                break
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                asked = study.ask()
                config = self.space.sample(asked)
            if config in known:  # proposed before: its score is known, and the sampler learns it again
                state, value, steps = known[config]
                for step, reported in steps.items():
                    asked.report(reported, step)
                study.tell(asked, value) if state == "complete" else study.tell(asked, state=states[state])
            elif config not in new:
                new.append(config)  # left running: TPE's constant liar keeps the rest of the round away from it
        return [(config, self._trials_of(config)) for config in new]

    def _trials_of(self, config: Config) -> list[Trial]:
        return expand_points(self.spec, self.fingerprints, [(config.family, [config.point], [config.lookback])])
