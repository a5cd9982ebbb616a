"""`ensemble:` a campaign's declared ensemble (N-BEATS' recipe: many models over lookbacks, losses and seeds).

    ensemble:
      families: [nbeats]        # members: every trial of these families (left out: every learned family; [] is refused)
      lookbacks: [2, 3, 4, 5]   # multiples of task.horizon (>= 1; 1.5 too, where it makes whole steps): each member family also trains at these
      losses: [mae, smape]      # each member family trains once per loss (a grid axis)
      combine: median           # or mean
      within: 1.5               # members whose validation score is within 1.5x the best member's (null: all)
      select: best              # then: the lookback range whose combination scores best on validation (greedy: forward
                                #   selection of members; null: all that are within)
      padded: leave_out         # a member whose lookback a series' history does not fill sits that series out (keep: it joins)

The losses are folded into the member networks' grids before the campaign is checked (`fold_ensemble`) and the
lookbacks join the member families' own (`CampaignSpec.lookbacks`; the other families keep task.lookback): they
become trials like any other, so trials of one shape train as one pack and a re-run keeps what finished. After a run the
ensemble is combined per project from its members' stored test forecasts and scored like a trial
(campaign/results/ensembles.py: `declared_ensemble`).

`lookback_multiples` and `member_families` are the one check of those two fields: the fold runs them on the file
(a value it could not fold is refused there, at its line), and `EnsembleSpec` runs them again, so the scheduler and
every worker (which re-validate the folded spec) hold the same ensemble or none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from gpufill.campaign.spec.spec_errors import LocatedError
from gpufill.campaign.spec.spec_types import Spec
from gpufill.forecasting.training import REGRESSION_LOSSES
from gpufill.forecasting.models import registry

__all__ = ["EnsembleSpec", "default_members", "fold_ensemble", "lookback_multiples", "member_families"]

LossName = Literal[REGRESSION_LOSSES]  # type: ignore[valid-type]  # engine/config.py names them


class EnsembleSpec(Spec):
    families: list[str] | None = None
    """Member families (each must be in `models`); None (left out): every family but the statistical references."""
    lookbacks: list[int | float] | None = None
    """Multiples (>= 1) of task.horizon, each a lookback every member trains at: a fraction too (1.5), where its
    product with task.horizon is a whole number of steps."""
    losses: list[LossName] | None = Field(default=None, min_length=1)
    """Each member network trains once per loss."""
    combine: Literal["median", "mean"] = "median"
    within: float | None = Field(default=1.5, ge=1.0, allow_inf_nan=False)
    """A member joins only if its validation score (task.metric) is within this factor of the best member's on the
    same project; null: every member joins. A member trained badly (a loss or a setting that did not work) would
    drag the median with it; the members left out, and why, are kept with the row and shown in the summary."""
    select: Literal["best", "greedy"] | None = None
    """best: of the members within, those of the contiguous range of lookbacks (of the n(n+1)/2) whose combination
    scores best on the validation windows, `padded` applied within each range (campaign/results/lookback_range.py): a
    choice coarse enough not to fit one validation window's noise. greedy: those that forward selection with
    replacement (Caruana et al. 2004) adds to the combination one at a time while its validation score improves, each
    weighted by how often it was added (campaign/results/greedy.py); it fits the validation window more closely (its
    test score trailed on M1, Tourism and M3: docs/forecasting.md). A global campaign's members are chosen once over
    every project's validation windows (one model joins for all), a local campaign's per project. null: every member
    within joins."""

    padded: Literal["keep", "leave_out"] = "keep"
    """leave_out: in a series whose history before its first test window is shorter than a member's lookback (global
    mode pads its input with the scaler's centre), that member is left out of the series' combination, with the reason
    "padded"; where no member's lookback fits, the members of the shortest lookback stay. keep: every member joins."""

    @field_validator("lookbacks", mode="before")
    @classmethod
    def _check_lookbacks(cls, value: Any) -> Any:
        return None if value is None else lookback_multiples(value)

    @field_validator("families", mode="before")
    @classmethod
    def _check_families(cls, value: Any) -> Any:
        return None if value is None else member_families(value)


_LOOKBACKS_FIX = "write multiples of task.horizon in digits, e.g. lookbacks: [1, 1.5, 2, 3] (task.lookback takes other lengths)"


def lookback_multiples(value: Any, loc: tuple[str | int, ...] = (), horizon: Any = None) -> list[int | float]:
    """`ensemble.lookbacks` as numbers >= 1 (a whole one as an int), or a LocatedError at the first bad item (`loc`:
    where the list is, relative to what is being validated); with `horizon` (task.horizon, where the file gives a
    whole one), also one whose product with it is not a whole number of steps. Nothing is dropped or rounded: what is
    folded is what was written."""
    if not isinstance(value, list) or not value:
        raise LocatedError(loc, f"expected a list of multiples of task.horizon, got {value!r}", fix=_LOOKBACKS_FIX)
    steps = horizon if isinstance(horizon, int) and not isinstance(horizon, bool) and horizon >= 1 else None
    multiples: list[int | float] = []
    for index, item in enumerate(value):
        fix = _LOOKBACKS_FIX
        if isinstance(item, bool):  # YAML's true/yes/on: a bool is an int to Python, never a length
            problem = f"{str(item).lower()} is not a number"
        elif isinstance(item, str):  # quoted, or a YAML 1.1 float without a dot or sign (1e9, 1.0e9 read as text)
            problem = f"{item!r} is text to YAML, not a number"
            fix = f"write the multiple in digits without quotes{_as_digits(item)}, e.g. lookbacks: [2, 3, 4]"
        elif not isinstance(item, int | float):
            problem = f"{item!r} is not a number"
        elif not math.isfinite(item) or item < 1:
            problem = f"{item!r} is not a multiple >= 1 of task.horizon"
        elif steps is not None and not math.isclose(item * steps, round(item * steps), abs_tol=1e-9):
            problem = f"{item!r} x task.horizon {steps} = {item * steps:g} steps, no whole lookback (it would be rounded to another one)"
            fix = "pick multiples whose product with task.horizon is a whole number of steps (1.5 with an even horizon), or write the lookback in task.lookback"
        else:
            multiples.append(int(item) if float(item).is_integer() else float(item))
            continue
        raise LocatedError((*loc, index), problem, fix=fix)
    return multiples


def _as_digits(text: str) -> str:
    """" (4)" for the text '4' or '4.0', "" where the text is no whole number."""
    try:
        number = float(text)
    except ValueError:
        return ""
    return f" ({int(number)})" if number.is_integer() and abs(number) < 1e18 else ""


def member_families(value: Any, loc: tuple[str | int, ...] = ()) -> Any:
    """`ensemble.families` as written, refused when it is an empty list (which would silently mean every family);
    other types are left to pydantic to name."""
    if isinstance(value, list) and not value:
        raise LocatedError(loc, "an empty list names no member family", fix="list the member families, or leave families out for every learned family")
    return value


def default_members(families: list[str]) -> list[str]:
    """Every family but the statistical references (snaive, ets, theta: what an ensemble is measured against)."""
    references = {name for name in registry.families("classical") if registry.resolve(name).fits_series}
    return [name for name in families if name not in references]


def fold_ensemble(data: Any) -> Any:
    """The campaign file (a mapping) with its ensemble's losses added as a `loss` axis of each member network's grid
    (its lookbacks are added to the member families' own, `CampaignSpec.lookbacks`); idempotent (a checked spec folds to itself). Bad lookbacks or
    families are refused here, at their line (never skipped: the workers fold the same spec); anything else
    malformed is left for validation to name."""
    if not isinstance(data, Mapping) or not isinstance(data.get("ensemble"), Mapping):
        return data
    ensemble, task, models = data["ensemble"], data.get("task"), data.get("models")
    multiples = ensemble.get("lookbacks")
    if multiples is not None:
        horizon = task.get("horizon", 1) if isinstance(task, Mapping) else None  # TaskSpec's default horizon is 1
        multiples = lookback_multiples(multiples, ("ensemble", "lookbacks"), horizon)
    if ensemble.get("families") is not None:
        member_families(ensemble["families"], ("ensemble", "families"))
    if not isinstance(task, Mapping) or not isinstance(models, Mapping):
        return data
    folded = dict(data)
    losses = ensemble.get("losses")
    if isinstance(losses, list) and losses:
        members = ensemble.get("families") or default_members(list(models))
        grids = dict(models)
        classical = set(registry.families("classical"))  # a loss is a network's: classical members join without one
        for name in members if isinstance(members, list) else []:
            if name not in grids or name in classical:  # an unknown member is named by the spec's check
                continue
            grid = grids[name]
            if isinstance(grid, Mapping) or grid is None:
                grid = dict(grid or {})
                given = grid.get("loss", [])
                grid["loss"] = list(dict.fromkeys([*(given if isinstance(given, list) else [given]), *losses]))
                grids[name] = grid
        folded["models"] = grids
    return folded
