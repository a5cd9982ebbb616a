"""The campaign file: pydantic models for the YAML and :func:`load_campaign`.

Unknown keys are errors at every level. Every error from :func:`load_campaign` is an
:class:`InputError` naming ``file:line``, the dotted field (``models.lstm.hidden_size``),
the problem and the fix; the line comes from the YAML node tree (``yaml.compose``), the
values from one ``yaml.safe_load``.

Model grids: in ``models: {family: {key: value}}`` a list is a grid axis, a scalar a fixed
value (a one-item axis); a list-valued parameter is written as a one-item axis ``[[64, 32]]``.
In a neural family, the training keys :data:`TRAIN_KEYS` are per-family training overrides
(``lstm: {lr: [1e-3, 3e-4]}``); every other key is a parameter of the family's factory.

Beside it: its sections' models, :mod:`.data_spec`, :mod:`.task_spec`, :mod:`.train_spec`,
:mod:`.resources_spec` and :mod:`.ensemble_spec` (this module re-exports them); :mod:`.spec_errors` (reading
the YAML, pydantic errors as ``file:line``); :mod:`.grid_checks` (model grids and task lengths).
"""

from __future__ import annotations


import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufill.campaign.spec.build_check import check_or_defer
from gpufill.campaign.spec.grid_checks import (
    TRAIN_KEYS,
    WINDOW_KEYS,
    check_grid,
    check_length,
    is_setting,
)
from gpufill.campaign.spec.data_spec import SYNTHETIC_DEFAULT_PROJECTS, DataSpec
from gpufill.campaign.spec.ensemble_spec import EnsembleSpec, default_members, fold_ensemble
from gpufill.campaign.spec.resources_spec import ResourcesSpec, SlurmSpec
from gpufill.campaign.spec.search_spec import SearchSpec
from gpufill.campaign.spec.tracking_spec import TrackingSpec
from gpufill.campaign.spec.user_models import inspect_in_child
from gpufill.campaign.spec.spec_errors import (
    LocatedError,
    allowed_keys,
    first_duplicate,
    line_index,
    line_of,
    read_yaml,
    to_input_error,
)
from gpufill.campaign.spec.spec_limits import Seed, check_grid_points, check_trial_count
from gpufill.campaign.spec.spec_types import Spec
from gpufill.campaign.spec.task_spec import SplitSpec, TaskSpec
from gpufill.campaign.spec.train_spec import EarlyStoppingSpec, TrainSpec
from gpufill.forecasting.data import Project
from gpufill.forecasting.data.split import WindowLayout, window_layout

if TYPE_CHECKING:
    from gpufill.forecasting.data.windows import WindowedProject
from gpufill.errors import InputError
from gpufill.forecasting.training import FitConfig, outputs_per_target
from gpufill.forecasting.models import registry
from gpufill.forecasting.recipes import Recipe, recipe

__all__ = [
    "TRAIN_KEYS",
    "CampaignSpec",
    "DataSpec",
    "EarlyStoppingSpec",
    "ResourcesSpec",
    "SlurmSpec",
    "SplitSpec",
    "TaskSpec",
    "TrainSpec",
    "load_campaign",
]

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


# --- campaign ----------------------------------------------------------------------------------


class CampaignSpec(Spec):
    """One campaign file. ``models`` holds each family's grid with every value as a list (an axis)."""

    name: str
    """Names the workdir and the report: letters, digits, '_', '.', '-'."""
    data: DataSpec = DataSpec()
    task: TaskSpec = TaskSpec()
    search: SearchSpec | None = None
    """Sample the grids (campaign/spec/search_spec.py) instead of training every point; before `models`, whose ranges it allows."""
    models: dict[str, dict[str, Any]]
    """family -> {key: axis}; see the module docstring."""
    train: TrainSpec = TrainSpec()
    seeds: list[Seed] = [0]
    resources: ResourcesSpec = ResourcesSpec()
    ensemble: EnsembleSpec | None = None
    """The declared ensemble (campaign/spec/ensemble_spec.py): its lookbacks and losses are folded into task and models."""
    tracking: TrackingSpec | None = None
    """Where finished trials are copied to (campaign/spec/tracking_spec.py: an MLflow server); never part of a trial id."""
    path: Path | None = Field(default=None, exclude=True)
    """The file this spec was loaded from (relative data paths resolve against its folder)."""

    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fold_ensemble(cls, data: Any) -> Any:
        return fold_ensemble(data)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            suggestion = re.sub(r"[^A-Za-z0-9_.-]+", "_", value).strip("_") or "my_campaign"
            raise InputError(f"name {value!r} may hold only letters, digits, '_', '.' and '-'", fix=f"rename it, e.g. {suggestion}")
        return value

    @field_validator("seeds", mode="before")
    @classmethod
    def _one_seed(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("seeds")
    @classmethod
    def _check_seeds(cls, value: list[int]) -> list[int]:
        if not value:
            raise InputError("no seeds given", fix="give at least one seed, e.g. seeds: [0]")
        seen = first_duplicate(value)
        if seen is not None:
            raise LocatedError((seen,), f"seed {value[seen]} is listed twice", fix="list each seed once (a repeat would train the same trial twice)")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _empty_grids(cls, value: Any) -> Any:
        # `linear:` with nothing after it is YAML null: the family with its defaults.
        if isinstance(value, Mapping):
            return {key: ({} if grid is None else grid) for key, grid in value.items()}
        return value

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, list[Any]]]:
        if not value:
            raise InputError("no model families given", fix="add at least one family, e.g. models: {lstm: {hidden_size: [64]}}")
        if _checked_already(info):  # a worker: the scheduler checked these grids; importing a factory is for building it
            return value
        check_grid_points(value)  # before any grid point is built, here or in the inspection child
        task = info.data.get("task")
        # The scheduler's own `module:factory` models: imported, checked and built in a child process.
        search = info.data.get("search") is not None
        inspected = inspect_in_child(value, min(task.lookback) if task else None, task.horizon if task else None, search=search)
        for family, found in inspected.items():
            if found.get("error"):
                error = found["error"]
                loc = tuple(error["loc"][1:]) if error["loc"] and error["loc"][0] == "models" else tuple(error["loc"])  # relative to models
                raise LocatedError(loc, error["problem"], fix=error["fix"])
        return {family: check_grid(family, grid, TrainSpec, TaskSpec, search=search) for family, grid in value.items()}

    @model_validator(mode="after")
    def _check_against_task(self, info: ValidationInfo) -> CampaignSpec:
        if self.data.source == "synthetic":
            check_length(self.data.length, self.task.split.to_split(), lookback=max(self.every_lookback), horizon=self.task.horizon)
        if _checked_already(info):
            return self
        known = self.data.projects if isinstance(self.data.projects, int) else len(self.data.projects) if isinstance(self.data.projects, list) else None
        if self.data.source == "synthetic" and known is None:
            known = SYNTHETIC_DEFAULT_PROJECTS
        self.check_trial_count(known or 1)  # before any grid point is built: a grid of a billion points is refused at once
        if self.search is not None:
            self._check_search()
        for family in self.models:
            check_or_defer(family, self.models[family], lookback=min(self.lookbacks(family)), horizon=self.task.horizon,
                           outputs_per_step=self.outputs_per_step(family))
            self._check_recipes(family)
        for index, family in enumerate(self.ensemble.families or [] if self.ensemble else []):
            if family not in self.models:
                raise LocatedError(("ensemble", "families", index), f"ensemble member {family!r} is not a family of models",
                                   fix=f"list families of models ({', '.join(self.models)}), or leave families out for all of them")
        return self

    def _check_search(self) -> None:
        """What a search needs of the rest of the file: a validation window to choose on, and no declared ensemble."""
        if self.search.metric is not None and self.search.metric != self.search_metric:
            raise LocatedError(("search", "metric"), f"search.metric {self.search.metric} and task.metric {self.task.metric} disagree: results rank "
                               "configurations by task.metric on the validation window",
                               fix=f"set task.metric: {self.search.metric.removeprefix('val_')} (or leave search.metric out: it follows task.metric)")
        if not self.task.split.val:
            raise LocatedError(("task", "split", "val"), f"the search's {self.search_metric} is scored on the validation window, and split.val is 0",
                               fix=f"set task.split.val (e.g. {self.task.horizon}), so the search chooses without reading the test window")
        if self.ensemble is not None:
            raise LocatedError(("ensemble",), "a declared ensemble combines a grid's trials; a search samples configurations",
                               fix="remove ensemble: from the search campaign (or search: to train the ensemble's grid)")

    @property
    def search_metric(self) -> str:
        """What a search minimises: task.metric on the validation window (`val_mae`, ...), as results rank."""
        return f"val_{self.task.metric}"

    def ensemble_members(self) -> list[str]:
        """The declared ensemble's member families (none without an ensemble)."""
        if self.ensemble is None:
            return []
        return list(self.ensemble.families or default_members(list(self.models)))

    def outputs_per_step(self, family: str) -> list[int]:
        """Each width a forecast step of `family`'s networks takes under the losses its trials train with (the grid's
        `loss:` axis, else train.loss): 1, and `quantile`'s 5 where it is one of them."""
        if self.kind(family) != "neural":
            return [1]
        losses = self.models[family].get("loss", [self.train.loss])
        return sorted({outputs_per_target(loss) for loss in (losses if isinstance(losses, list) else [losses])})

    def _check_recipes(self, family: str) -> None:
        """Every scaling and loss the family's grid can combine makes a valid recipe (sMAPE needs mean scaling)."""
        grid = self.models[family]
        fam = registry.resolve(family)
        if not (is_setting(fam, "scaling") and fam.kind == "neural"):
            return
        for scaling in grid.get("scaling", [self.task.scaling]):
            for loss in grid.get("loss", [self.train.loss]):
                try:
                    self.recipe(family, {"scaling": scaling, "loss": loss})
                except InputError as exc:
                    loc = ("models", family, "loss") if "loss" in grid else ("train", "loss") if loss != "auto" else ("task", "scaling")
                    raise LocatedError(loc, exc.problem, fix=exc.fix) from None

    def check_trial_count(self, projects: int, *, where: str | None = None) -> None:
        """At most MAX_TRIALS trials (spec_limits.py); `where`: the file:line to name once the spec is loaded. A search
        trains at most `search.trials` configurations, each with every seed (on every project in local mode)."""
        if self.search is not None:
            check_trial_count({"search": {"trials": [None] * self.search.trials}}, 1, len(self.seeds), projects,
                              one_project=self.task.mode == "global", where=where)
            return
        check_trial_count(self.models, len(self.every_lookback), len(self.seeds), projects, one_project=self.task.mode == "global", where=where)

    # -- helpers for the rest of the campaign -----------------------------------------------

    @property
    def base_dir(self) -> Path:
        """Folder that relative data paths resolve against."""
        return self.path.parent if self.path is not None else Path.cwd()

    def kind(self, family: str) -> registry.ModelKind:
        return registry.resolve(family).kind

    def lookbacks(self, family: str) -> list[int]:
        """The lookbacks a family's trials run at: task.lookback, and a declared ensemble's lookbacks for its member
        families only. A family that fits the whole series (snaive, ets, theta) reads no window, and every lookback's
        test windows are the same: one trial per project and grid point, at the shortest lookback (a lookback grid
        used to re-run it with identical results)."""
        if registry.resolve(family).fits_series:
            return [min(self.task.lookback)]
        added = self._ensemble_lookbacks() if family in self.ensemble_members() else []
        return list(dict.fromkeys([*self.task.lookback, *added]))

    @property
    def every_lookback(self) -> list[int]:
        """Every lookback some family runs at (task.lookback and the declared ensemble's), sorted: what the data must
        hold. Resolves no family: a worker checking its spec must not import a user's model module it does not train
        (one that crashes on import took the worker of a `linear` trial with it)."""
        return sorted({*self.task.lookback, *self._ensemble_lookbacks()})

    def _ensemble_lookbacks(self) -> list[int]:
        """The declared ensemble's lookbacks in steps (its multiples of task.horizon; none without them)."""
        multiples = self.ensemble.lookbacks if self.ensemble is not None and self.ensemble.lookbacks else []
        return [round(m * self.task.horizon) for m in multiples]  # whole steps: ensemble_spec.lookback_multiples checked

    def seeds_of(self, family: str) -> list[int]:
        """The seeds a family's trials run with. A deterministic family (the statistical references snaive, ets, theta)
        draws no random number: every seed would give the same forecast, so it runs once per project and grid point,
        with the smallest seed."""
        if registry.resolve(family).deterministic:
            return [min(self.seeds)]
        return list(self.seeds)

    def split_point(self, family: str, point: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A grid point as (model params, training and window overrides), each sorted by key."""
        fam = registry.resolve(family)
        params = {k: point[k] for k in sorted(point) if not is_setting(fam, k)}
        train = {k: point[k] for k in sorted(point) if is_setting(fam, k)}
        return params, train

    def recipe(self, family: str, train: Mapping[str, Any]) -> Recipe:
        """How a trial of `family` with these overrides is trained: scaling, loss, schedule (auto: the family's recipe).
        `train.loss` is a network's: a classical family (one fit, no loss) keeps its recipe whatever the campaign's loss."""
        loss = train.get("loss", self.train.loss) if self.kind(family) == "neural" else "auto"
        return recipe(family, scaling=train.get("scaling", self.task.scaling), loss=loss,
                      schedule=train.get("schedule", self.train.schedule))

    def windows(self, project: Project, lookback: int, *, folded: bool = False) -> WindowedProject:
        """`project` cut for this task at `lookback` (global mode left-pads a series too short for it); `folded`: with
        the validation region folded into training (what a refit trains on: train.refit), the test region the same."""
        task, split = self.task, self.task.split.to_split()
        from gpufill.forecasting.data.windows import make_windows  # torch's side: a worker's, never the scheduler's

        return make_windows(project, lookback, task.horizon, replace(split, val=0) if folded else split, task.stride, pad=task.mode == "global")

    def window_layout(self, project: Project, lookback: int) -> WindowLayout:
        """Where `windows` would cut `project` at `lookback` (or one line naming what does not fit), without cutting."""
        task = self.task
        return window_layout(project, lookback, task.horizon, task.split.to_split(), task.stride, pad=task.mode == "global")

    def where(self, *loc: str | int) -> str:
        """``file:line`` of the deepest key of ``loc`` present in the file (the file alone if unknown)."""
        if self.path is None:
            return "campaign"
        return f"{self.path}:{line_of(loc, self._lines)[1]}" if self._lines else str(self.path)

    def load_projects(self) -> dict[str, Project]:
        """The campaign's projects (``data.load`` with this file's folder and location)."""
        return self.data.load(self.base_dir, where=self.where("data", "projects"))

    def base_config(self, train: Mapping[str, Any], seed: int) -> FitConfig:
        """A trial's training settings as a FitConfig: the train section with its grid point's overrides and its seed
        (forecasting.run.trial_setup adds the recipe's loss and schedule and the worker's device and threads)."""
        return self.train.fit_config({k: v for k, v in train.items() if k not in WINDOW_KEYS}, seed)


CHECKED = {"checked": True}
"""Validation context of a spec the scheduler checked already (`CampaignSpec.model_validate(payload, context=CHECKED)`
in the workers): its model grids are taken as they are, so a worker imports only the factories it builds."""


def _checked_already(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("checked"))


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and check a campaign file; any problem is an InputError naming ``file:line``."""
    path = Path(path)
    root, data = read_yaml(path)
    lines = line_index(root, str(path))
    if "path" in data:  # a field of the spec, but set from where the file is, never in it
        raise InputError("unknown key 'path'", fix=f"remove it; allowed keys: {', '.join(allowed_keys(CampaignSpec, ()))}", where=f"{path}:{lines[('path',)]}", field="path")
    try:
        spec = CampaignSpec.model_validate({**data, "path": path})
    except ValidationError as exc:
        raise to_input_error(exc, lines, str(path), CampaignSpec) from None
    spec._lines = lines
    return spec
