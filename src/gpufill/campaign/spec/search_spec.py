"""`search:` a campaign that samples its families' grids instead of training every point.

    search:
      sampler: tpe          # random | tpe | grid (Optuna's samplers: SAMPLERS below)
      trials: 200           # configurations to train (each with every seed; in local mode on every project)
      seed: 0               # the sampler's: the same seed and results propose the same configurations
      metric: val_smape     # what is minimised: task.metric on the validation window (left out: it follows task.metric)
      direction: minimize  # the only one: every metric gpufill scores is an error
      batch: 8              # configurations proposed together (a round): they train side by side, packed by shape,
                            # and the sampler learns from a round's results before it proposes the next
      pruner: {kind: asha, min_epochs: 2, reduction_factor: 3}   # or median, or none (the default)

With `search:` the families' grids are the search space: a list is a categorical choice, and two forms that only a
search accepts are ranges, ``{low: 1e-4, high: 1e-2, log: true}`` (a float, log-uniform here) and
``{low: 32, high: 256, step: 32}`` (an int: low, high and step whole numbers). Outside `search:` a range is refused
at its line (a grid needs the values listed). `task.lookback` with several values is a choice too, and so is the
family when there are several.

A pruner (Optuna's SuccessiveHalvingPruner, i.e. ASHA, or MedianPruner) stops a network's trial at an epoch where its
validation score (`metric`, in the data's own units) is among the worse of those the earlier rounds' trials had at that
epoch: the trial ends `pruned`, with the epoch it reached and its last score, and is never ranked as finished.
Decisions read only earlier rounds (replayed through the pruner in proposal order), so they are the same on a resumed
run. Classical families (one fit) are sampled, never pruned.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator

from gpufill.campaign.spec.spec_errors import LocatedError
from gpufill.campaign.spec.spec_types import SCIENTIFIC, Count, Spec, at_most
from gpufill.forecasting.trial import METRICS

__all__ = ["MAX_SEARCH_BATCH", "MAX_SEARCH_TRIALS", "PRUNERS", "RANGE_KEYS", "SAMPLERS", "PrunerSpec", "Range", "SearchSpec", "is_range",
           "parse_range"]

MAX_SEARCH_TRIALS = 100_000
"""Configurations one search proposes (each is a round trip through the sampler, whose TPE grows with its history)."""
MAX_SEARCH_BATCH = 256
"""Configurations one round proposes: TPE's asks within a round grow with the round's running proposals (its constant
liar), so a round of 2,000 took 19 s before its first trial and one of 20,000 registered nothing in 3 minutes; past a
few hundred at once the sampler also has nothing to learn between rounds."""
RANGE_KEYS = frozenset({"low", "high", "log", "step"})


@dataclass(frozen=True, slots=True)
class SamplerKind:
    """What `search.sampler: NAME` means: Optuna's sampler, built from the optuna module (imported by a search alone),
    the round's seed and the space's distributions (name -> Optuna's distribution)."""

    build: Callable[[Any, int, Mapping[str, Any]], Any]


def _tpe(optuna: Any, seed: int, space: Mapping[str, Any]) -> Any:
    with warnings.catch_warnings():  # constant_liar is marked experimental
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True, group=True)


SAMPLERS: dict[str, SamplerKind] = {
    "random": SamplerKind(lambda optuna, seed, space: optuna.samplers.RandomSampler(seed=seed)),
    "tpe": SamplerKind(_tpe),
    "grid": SamplerKind(lambda optuna, seed, space: optuna.samplers.GridSampler({name: list(d.choices) for name, d in space.items()}, seed=seed)),
}
"""Every sampler a campaign file may name (`search.sampler` takes these names alone): add one here."""


@dataclass(frozen=True, slots=True)
class PrunerKind:
    """What `search.pruner.kind: NAME` means: how its decisions are named, whether it reads every epoch's score (else
    only at its rungs, min_epochs x reduction_factor^k), and Optuna's pruner built from the module and the settings."""

    label: str
    every_epoch: bool
    build: Callable[[Any, Mapping[str, Any]], Any]


PRUNERS: dict[str, PrunerKind] = {
    "asha": PrunerKind("ASHA", False, lambda optuna, s: optuna.pruners.SuccessiveHalvingPruner(min_resource=s["min_epochs"],
                                                                                                  reduction_factor=s["reduction_factor"])),
    "median": PrunerKind("the median rule", True, lambda optuna, s: optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=s["min_epochs"] - 1)),
}
"""Every pruner a campaign file may name besides `none` (`search.pruner.kind` takes these names alone): add one here."""


class PrunerSpec(Spec):
    kind: Literal[tuple(["none", *PRUNERS])] = "none"  # type: ignore[valid-type]  # the names of PRUNERS, and none
    min_epochs: Count = 1
    """ASHA's first rung (its min_resource); the median rule's warm-up: no trial is stopped before it."""
    reduction_factor: Annotated[int, Field(ge=2)] = 3
    """ASHA: one in reduction_factor trials goes on at each rung (rungs at min_epochs x reduction_factor^k)."""


class SearchSpec(Spec):
    sampler: Literal[tuple(SAMPLERS)] = "tpe"  # type: ignore[valid-type]  # the names of SAMPLERS
    trials: Annotated[Count, at_most(MAX_SEARCH_TRIALS, "configurations one search proposes")] = 50
    seed: Annotated[StrictInt, Field(ge=0)] = 0
    """The sampler's seed (numpy's SeedSequence takes whole numbers from 0)."""
    metric: str | None = None
    """`val_` + task.metric (what `results` ranks by, so the search and its results choose alike); None: that."""
    direction: Literal["minimize"] = "minimize"
    """Every metric gpufill scores is an error (lower is better), as results rank them."""
    batch: Annotated[Count, at_most(MAX_SEARCH_BATCH, "configurations one round proposes")] = 8
    pruner: PrunerSpec = PrunerSpec()

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str | None) -> str | None:
        if value is None:
            return value
        known = [f"val_{name}" for name in METRICS]
        if value not in known:
            raise LocatedError((), f"unknown search metric {value!r}: a search chooses on the validation window",
                               fix=f"use one of {', '.join(known)}")
        return value



class Range(Spec):
    """A numeric search range (see the module docstring): an int range when low, high (and step) are whole numbers."""

    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False

    def corners(self) -> list[Any]:
        """Its two ends, as the values a family is built with at load time."""
        cast = int if self.integer else float
        return [cast(self.low), cast(self.high)]


def is_range(value: Any) -> bool:
    """A grid value written as a range: a mapping with low and high (and at most log and step besides)."""
    return isinstance(value, Mapping) and {"low", "high"} <= set(value) and set(value) <= RANGE_KEYS


def parse_range(loc: tuple[str | int, ...], value: Mapping[str, Any]) -> Range:
    """A range written in a family's grid, checked: numbers, low < high, a positive low for log, step or log."""
    def number(key: str) -> float | int:
        found = value[key]
        if isinstance(found, str) and SCIENTIFIC.match(found.strip()):
            found = float(found)  # YAML 1.1 reads 1e-4 (no dot) as text: it is the number a reader sees
        if isinstance(found, bool) or not isinstance(found, int | float) or not math.isfinite(found):
            raise LocatedError((*loc, key), f"range {key} must be a finite number, got {found!r}", fix=f"write {key} as a number, e.g. 1.0e-3")
        return found

    low, high = number("low"), number("high")
    step = number("step") if value.get("step") is not None else None
    log = value.get("log", False)
    if not isinstance(log, bool):
        raise LocatedError((*loc, "log"), f"range log must be true or false, got {log!r}", fix="write log: true for a log-uniform range")
    if low >= high:
        raise LocatedError(loc, f"range low {low!r} is not below high {high!r}", fix="give low < high (one value: write it without a range)")
    if log and low <= 0:
        raise LocatedError((*loc, "low"), f"a log range needs low > 0, got {low!r}", fix="raise low above 0, or drop log: true")
    if log and step is not None:
        raise LocatedError(loc, "a range takes step or log, not both", fix="drop step (log-uniform) or log (evenly stepped)")
    if step is not None and step <= 0:
        raise LocatedError((*loc, "step"), f"range step must be > 0, got {step!r}", fix="give a positive step")
    integer = all(isinstance(v, int) for v in (low, high, *(() if step is None else (step,))))
    return Range(low=low, high=high, log=log, step=step, integer=integer)
