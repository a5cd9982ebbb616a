"""Checks of a campaign's model grids and task, run while :class:`CampaignSpec` validates.

:func:`check_grid` makes every value of a family's grid an axis and validates training values;
:func:`check_builds` builds every grid point once, so a bad value fails at load time;
:func:`check_length` checks that a synthetic series holds the task's windows. Problems are
:class:`LocatedError` so that ``load_campaign`` reports them at ``file:line``.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from gpufill.campaign.spec.search_spec import Range, is_range, parse_range
from gpufill.campaign.spec.spec_errors import LocatedError, explain, first_duplicate, show
from gpufill.forecasting.data import Split, split_bounds
from gpufill.errors import InputError
from gpufill.forecasting.models import registry


__all__ = ["TRAIN_KEYS", "WINDOW_KEYS", "check_builds", "check_grid", "check_length", "corner_axes", "is_setting"]

TRAIN_KEYS = frozenset({"lr", "weight_decay", "batch_size", "epochs", "max_steps", "loss", "schedule", "optimizer"})
"""Training settings a neural family's grid may override (``lstm: {lr: [1e-3, 3e-4]}``)."""
WINDOW_KEYS = frozenset({"scaling"})
"""How windows are presented, which any window model's grid may override (``lgbm: {scaling: [project, last]}``)."""


def is_setting(fam: registry.Family, key: str) -> bool:
    """Whether grid key `key` of `fam` is a training or window setting rather than a factory parameter
    (a neural family's settings win over a same-named parameter; a classical factory's own parameter wins)."""
    if fam.fits_series:
        return False
    if fam.kind == "neural":
        return key in TRAIN_KEYS | WINDOW_KEYS
    return key in WINDOW_KEYS and key not in fam.defaults


def check_grid(family: str, grid: dict[str, Any], train: type[BaseModel], task: type[BaseModel], *, search: bool = False
               ) -> dict[str, list[Any] | Range]:
    """One family's grid with every value an axis; training and window settings validated and coerced by
    ``train`` (TrainSpec) and ``task`` (TaskSpec). `search`: the campaign samples its grids, so a range
    ``{low, high, log | step}`` is an axis too (campaign/spec/search_spec.py); without it a range is refused here."""
    try:
        fam = registry.resolve(family)
    except InputError as exc:
        raise LocatedError((family,), exc.problem, fix=exc.fix) from None
    axes: dict[str, list[Any] | Range] = {}
    for key, value in grid.items():
        if is_range(value):
            axes[key] = _range_axis(fam, family, key, value, train, task, search=search)
            continue
        values = list(value) if isinstance(value, list) else [value]
        if not values:
            default = fam.defaults.get(key, "...")
            raise LocatedError((family, key), f"empty grid for {key!r}: [] gives no trials", fix=f"give at least one value, e.g. {key}: [{default}], or remove {key} to use the default")
        if is_setting(fam, key):
            model = task if key in WINDOW_KEYS else train
            values = [_training_value(model, family, key, i if isinstance(value, list) else None, v) for i, v in enumerate(values)]
        elif key in WINDOW_KEYS and key not in fam.defaults:
            raise LocatedError((family, key), f"{family!r} fits each series itself, so {key!r} (how windows are scaled) does not apply",
                               fix=f"remove {key} from {family}")
        elif key in TRAIN_KEYS and key not in fam.defaults:
            raise LocatedError(
                (family, key),
                f"{key!r} is a training setting, but {family!r} is a classical model",
                fix=f"remove {key} from {family}: classical models have no lr, weight_decay, batch_size or epochs",
            )
        else:
            _check_param(fam, key)
        seen = first_duplicate(values)
        if seen is not None:
            raise LocatedError((family, key, seen), f"value {values[seen]!r} appears twice in the grid of {key!r}", fix="list each value once (a repeat would train the same trial twice)")
        axes[key] = values
    return axes


def _range_axis(fam: registry.Family, family: str, key: str, value: Any, train: type[BaseModel], task: type[BaseModel], *, search: bool) -> Range:
    """A range in a family's grid: a search's axis, checked at both ends; refused in a grid campaign."""
    if not search:
        raise LocatedError((family, key), f"{key}: a range {{low, high}} is a search space, and this campaign has no search: section",
                           fix=f"list the values of {key} (a grid trains each), or add search: {{sampler: tpe, trials: 50}} to sample the range")
    found = parse_range((family, key), value)
    if is_setting(fam, key):
        model = task if key in WINDOW_KEYS else train
        for end in ("low", "high"):
            _training_value(model, family, key, None, getattr(found, end) if not found.integer else int(getattr(found, end)))
    else:
        _check_param(fam, key)
    return found


def corner_axes(axes: Mapping[str, list[Any] | Range]) -> dict[str, list[Any]]:
    """A grid's axes with each range at its two ends: the points a load-time check builds."""
    return {key: axis.corners() if isinstance(axis, Range) else axis for key, axis in axes.items()}


def _check_param(fam: registry.Family, key: str) -> None:
    try:
        registry.check_params(fam.name, {key: None})
    except InputError:
        close = difflib.get_close_matches(key, [*fam.defaults, *(TRAIN_KEYS if fam.kind == "neural" else ())], n=1)
        accepted = ", ".join(fam.defaults) or "none"
        training = f"; training settings: {', '.join(sorted(TRAIN_KEYS))}" if fam.kind == "neural" else ""
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LocatedError(
            (fam.name, key),
            f"unknown parameter {key!r} for model family {fam.name!r}; accepted: {accepted}{training}",
            fix=f"{hint}rename or remove {key}",
        ) from None


def _training_value(train: type[BaseModel], family: str, key: str, index: int | None, value: Any) -> Any:
    loc = (family, key) if index is None else (family, key, index)
    try:
        return getattr(train.model_validate({key: value}), key)
    except ValidationError as exc:
        problem, fix = explain(exc.errors(), f"models.{family}.{key}")
        raise LocatedError(loc, problem, fix=fix) from None


def check_builds(family: str, axes: Mapping[str, list[Any] | Range], *, lookback: int, horizon: int,
                 outputs_per_step: Sequence[int] = (1,)) -> None:
    """Build every grid point once (training axes aside; a range at both ends), so bad values fail at load time;
    `outputs_per_step`: each width its trials' losses give a forecast step (engine/losses.outputs_per_target)."""
    if registry.is_remembered(family):  # a user's factory, built in a child process already (campaign/spec/user_models.py)
        return
    import torch  # here, not at the top: a scheduler whose families are all checked elsewhere never imports it

    fam = registry.resolve(family)
    model_axes = {k: v for k, v in corner_axes(axes).items() if not is_setting(fam, k)}
    for combo, per_step in itertools.product(itertools.product(*model_axes.values()), sorted(set(outputs_per_step))):
        params = dict(zip(model_axes, combo))
        # Building initialises weights: keep the caller's global RNG untouched.
        with torch.random.fork_rng(devices=[]):
            try:
                registry.build(family, n_features=1, lookback=lookback, horizon=horizon, params=params, outputs_per_step=per_step)
            except InputError as exc:
                key = str(exc.field or "").rpartition(".")[2]
                loc = (("models", family, key) if key in params or key in axes else ("train", "loss") if key == "loss"
                       else ("models", family))
                raise LocatedError(loc, f"{family} with {show(params)}: {exc.problem}", fix=exc.fix) from None
            except Exception as exc:  # a user factory may raise anything: report it as bad input
                raise LocatedError(
                    ("models", family),
                    f"building {family} with {show(params)} failed: {type(exc).__name__}: {exc}",
                    fix=f"change the values in {family}'s grid to ones its factory accepts",
                ) from None


def check_length(length: int, split: Split, *, lookback: int, horizon: int) -> None:
    """A synthetic series must hold a training window (of the longest lookback) and a horizon of val and test points."""
    try:
        train_end, val_end = split_bounds(length, split, horizon)
    except InputError as exc:
        raise LocatedError(("task", "split"), exc.problem, fix=exc.fix) from None
    longest = lookback
    if train_end < longest + horizon:
        raise LocatedError(
            ("task", "lookback"),
            f"lookback {longest} + horizon {horizon} does not fit the {train_end} training steps of a synthetic series of length {length}",
            fix=f"lower the lookback or raise data.length above {length}",
        )
    for name, size in (("val", val_end - train_end), ("test", length - val_end)):
        if 0 < size < horizon or (name == "test" and size == 0):
            raise LocatedError(("task", "split", name), f"split.{name} holds {size} steps, fewer than horizon {horizon}", fix=f"raise split.{name} or lower the horizon")

