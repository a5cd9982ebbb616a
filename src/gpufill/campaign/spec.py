"""The campaign file: pydantic models for the YAML and :func:`load_campaign`.

Unknown keys are errors at every level. Every error from :func:`load_campaign` is an
:class:`InputError` naming ``file:line``, the dotted field (``models.lstm.hidden_size``),
the problem and the fix; the line comes from the YAML node tree (``yaml.compose``), the
values from one ``yaml.safe_load``.

Model grids: in ``models: {family: {key: value}}`` a list is a grid axis, a scalar a fixed
value (a one-item axis); a list-valued parameter is written as a one-item axis ``[[64, 32]]``.
In a neural family, the training keys :data:`TRAIN_KEYS` are per-family training overrides
(``lstm: {lr: [1e-3, 3e-4]}``); every other key is a parameter of the family's factory.

Beside it: :mod:`.spec_errors` (reading the YAML, pydantic errors as ``file:line``),
:mod:`.grid_checks` (model grids and task lengths), :mod:`.resources_spec` (``resources``).
"""

from __future__ import annotations


import fnmatch
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufill.campaign.grid_checks import (
    TRAIN_KEYS,
    WINDOW_KEYS,
    check_builds,
    check_grid,
    check_length,
    is_setting,
)
from gpufill.campaign.ensemble_spec import EnsembleSpec, default_members, fold_ensemble
from gpufill.campaign.resources_spec import ResourcesSpec, SlurmSpec
from gpufill.campaign.user_models import inspect_in_child
from gpufill.campaign.spec_errors import (
    LocatedError,
    allowed_keys,
    dotted,
    explain,
    first_duplicate,
    line_index,
    line_of,
    read_yaml,
    to_input_error,
)
from gpufill.campaign.spec_limits import Length, Seed, check_grid_points, check_project_count, check_synthetic, check_trial_count
from gpufill.campaign.spec_types import Count, Float, Spec
from gpufill.forecasting.data import Project, Split, WindowedProject, load_projects, make_windows
from gpufill.errors import InputError
from gpufill.forecasting.training import DEFAULTS, FORECAST_EPOCHS, FORECAST_PATIENCE, FitConfig
from gpufill.forecasting.trial import METRICS
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

# projects: None on a synthetic source: the data layer's default count.
SYNTHETIC_DEFAULT_PROJECTS = 10
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SYNTHETIC_NAME = re.compile(r"^p(\d+)$")


# --- data --------------------------------------------------------------------------------------


class DataSpec(Spec):
    """Where the projects come from and which of them the campaign uses."""

    source: str = "synthetic"
    """"synthetic", a .csv/.parquet file, a directory or a glob; relative to the campaign file."""
    projects: StrictInt | list[str] | str | None = None
    """A count (the first N in name order; synthetic: N generated), a list of names, an fnmatch
    glob over names ("store_*"), or None for all (synthetic: 10)."""
    length: Annotated[Count, Length] = 2000
    """Time steps per synthetic project (synthetic only)."""
    seed: Seed = 0
    """Seed of the synthetic generator (synthetic only)."""
    target: str = "target"
    project_column: str = "project"
    time_column: str | None = None
    """None: a column named time/date/timestamp if there is one, else row order."""
    fill: Literal["none", "ffill", "interpolate", "zero"] = "none"
    """Missing values: "none" makes them an error."""

    @field_validator("projects", mode="before")
    @classmethod
    def _check_projects(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or (isinstance(value, int) and value < 1):
            raise InputError(f"expected a count >= 1, got {value!r}", fix="give a count >= 1, a list of names, a glob such as 'store_*', or null for all")
        check_project_count(value)
        if isinstance(value, str) and not value.strip():
            raise InputError("empty project name or glob", fix="give a name or glob such as 'store_*', or null for all")
        if isinstance(value, list):
            if not value:
                raise InputError("empty list of projects", fix="name at least one project, or set projects: null for all")
            for i, name in enumerate(value):
                if not isinstance(name, str):
                    raise LocatedError((i,), f"project names are strings, got {name!r}", fix=f"quote it: '{name}'")
            seen = first_duplicate(value)
            if seen is not None:
                raise LocatedError((seen,), f"project {value[seen]!r} is listed twice", fix="list each project once")
        return value

    @model_validator(mode="after")
    def _synthetic_only(self) -> DataSpec:
        if self.source != "synthetic":
            # Compared with the default, not "was it set": a dumped spec re-validates (workers do).
            for key in ("length", "seed"):
                if getattr(self, key) != DataSpec.model_fields[key].default:
                    raise LocatedError((key,), f"{key} applies only to source: synthetic", fix=f"remove {key}: it would be ignored")
            return self
        check_synthetic(self.projects, self.synthetic_count(), self.length)  # sizes that would take minutes or the memory: refused up front
        return self

    def synthetic_count(self) -> int:
        """How many synthetic projects are generated: the count, or far enough to hold every named pNNN."""
        count = self.projects if isinstance(self.projects, int) else SYNTHETIC_DEFAULT_PROJECTS
        if isinstance(self.projects, list):
            indices = [int(m[1]) for m in map(_SYNTHETIC_NAME.match, self.projects) if m]
            count = max([count, *(i + 1 for i in indices)])
        return count

    def load(self, base_dir: Path, *, where: str | None = None) -> dict[str, Project]:
        """The selected projects, keyed and ordered by name.

        Relative paths resolve against ``base_dir`` (the campaign file's folder). ``where``
        names the campaign file in selection errors.
        """
        where = where or "campaign"
        if self.source == "synthetic":
            loaded = load_projects("synthetic", n_projects=self.synthetic_count(), length=self.length, seed=self.seed)
        else:
            loaded = load_projects(
                self._resolved_source(Path(base_dir)),
                target=self.target,
                project_column=self.project_column,
                time_column=self.time_column,
                fill=self.fill,
            )
        names = self._select(sorted(loaded), where)
        return {name: loaded[name] for name in names}

    def _resolved_source(self, base_dir: Path) -> str:
        if ":" in self.source:  # a scheme (m3:monthly, s3://...) or a drive: leave it to the data layer
            return self.source
        path = Path(self.source).expanduser()
        return str(path if path.is_absolute() else base_dir / path)

    def _select(self, available: list[str], where: str) -> list[str]:
        wanted = self.projects
        shown = ", ".join(available[:5]) + (f", ... ({len(available)} in all)" if len(available) > 5 else "")
        if wanted is None:
            return available
        if isinstance(wanted, int):
            if wanted > len(available):
                raise InputError(
                    f"asks for {wanted} projects but the source has {len(available)}",
                    fix=f"set data.projects to at most {len(available)}, or null for all",
                    where=where,
                    field="data.projects",
                )
            return available[:wanted]
        if isinstance(wanted, str):
            matched = [name for name in available if fnmatch.fnmatchcase(name, wanted)]
            if not matched:
                raise InputError(
                    f"pattern {wanted!r} matches no project; available: {shown}",
                    fix="change the pattern (fnmatch: * any text, ? one character), or set projects: null for all",
                    where=where,
                    field="data.projects",
                )
            return matched
        known = set(available)  # once: a list of 20,000 names is checked in linear time
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise InputError(
                f"unknown project(s) {', '.join(map(repr, unknown[:5]))}; available: {shown}",
                fix="pick names from the available projects, or set projects: null for all",
                where=where,
                field="data.projects",
            )
        return sorted(wanted)


# --- task --------------------------------------------------------------------------------------


class RollingOrigins(Spec):
    windows: Count
    """How many forecast origins (each scored on its horizon)."""
    step: Count
    """Time steps between two origins."""


class BacktestSpec(Spec):
    """`test: {backtest: {windows: 3, step: 6}}`: the last origin forecasts the series' last horizon, each
    earlier one `step` before it; one training per trial, scored at every origin (metrics: their mean)."""

    backtest: RollingOrigins


class SplitSpec(Spec):
    """Validation and test regions at the end of each series: a fraction in [0, 1) or a count; the test
    region may be a backtest's rolling origins instead."""

    val: StrictInt | Float = 0.1
    test: StrictInt | Float | BacktestSpec = 0.2
    """Must hold test points: the campaign ranks trials on them."""

    @field_validator("val", "test")
    @classmethod
    def _check_size(cls, value: int | float | BacktestSpec) -> int | float | BacktestSpec:
        if isinstance(value, int) and value < 0:
            raise InputError(f"count {value} is negative", fix="give a count >= 0 or a fraction in [0, 1)")
        if isinstance(value, float) and not 0.0 <= value < 1.0:
            raise InputError(f"fraction {value} is outside [0, 1)", fix="give a fraction in [0, 1) or an integer count of time steps")
        return value

    @model_validator(mode="after")
    def _check_total(self) -> SplitSpec:
        if self.test == 0:
            raise LocatedError(("test",), "test=0 leaves nothing to score trials on", fix="set test to a fraction in (0, 1) or a count >= horizon")
        fractions = [v for v in (self.val, self.test) if isinstance(v, float)]
        if len(fractions) == 2 and sum(fractions) >= 1.0:
            raise LocatedError(("val",), f"val + test = {sum(fractions):g} leaves nothing to train on", fix="make val + test less than 1 (e.g. val 0.1, test 0.2)")
        return self

    def to_split(self) -> Split:
        if isinstance(self.test, BacktestSpec):
            return Split(val=self.val, test=0, backtest=(self.test.backtest.windows, self.test.backtest.step))
        return Split(val=self.val, test=self.test)


class TaskSpec(Spec):
    """What to forecast and how trials are scored."""

    lookback: list[Count] = [30]
    """Input window lengths, a grid axis (a single number is a one-item list)."""
    horizon: Count = 1
    split: SplitSpec = SplitSpec()
    metric: Literal[METRICS] = "mae"  # type: ignore[valid-type]  # the names of forecasting.trial.METRICS
    """Ranks results only; it never changes what is trained."""
    mode: Literal["local", "global"] = "local"
    """local: one model per project; global: one model over all projects."""
    stride: Count = 1
    """Step between training windows."""
    scaling: Literal["auto", "project", "last", "mean", "standard"] = "auto"
    """How each window's target is scaled (forecasting.data.window_scaling); auto: the family's recipe (forecasting.recipes)."""

    @field_validator("lookback", mode="before")
    @classmethod
    def _one_lookback(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("lookback")
    @classmethod
    def _check_lookbacks(cls, value: list[int]) -> list[int]:
        if not value:
            raise InputError("no lookback given", fix="give at least one window length, e.g. lookback: [30]")
        seen = first_duplicate(value)
        if seen is not None:
            raise LocatedError((seen,), f"lookback {value[seen]} is listed twice", fix="list each lookback once")
        return value


# --- training ----------------------------------------------------------------------------------


class EarlyStoppingSpec(Spec):
    patience: Count = FORECAST_PATIENCE
    """Validations without improvement before a training stops."""
    min_delta: Annotated[Float, Field(ge=0)] = 0.0
    """Smallest drop in validation loss that counts as an improvement."""


class TrainSpec(Spec):
    """Training settings for every neural trial (a family's grid may override TRAIN_KEYS)."""

    # Defaults are FitConfig's (engine/config.py), the one home of training defaults, but for the length:
    # a forecaster's (forecasting/training.py: an upper bound that early stopping ends).
    epochs: Count = FORECAST_EPOCHS
    batch_size: Count | Literal["auto"] = DEFAULTS.batch_size
    """Effective batch; "auto": the plan picks it for throughput."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = DEFAULTS.precision
    compile: StrictBool | Literal["auto"] = DEFAULTS.compile
    cuda_graph: StrictBool | Literal["auto"] = DEFAULTS.cuda_graph
    """Fused packs on a GPU: replay each step as one captured CUDA graph (auto: when measured faster; cached per shape)."""
    batch_search: StrictBool | Literal["auto"] = DEFAULTS.batch_search
    """Measure micro-batch sizes and keep the fastest (auto: on GPUs for long trainings); cached per shape in the workdir."""
    lr: Annotated[Float, Field(gt=0)] = DEFAULTS.lr
    weight_decay: Annotated[Float, Field(ge=0)] = DEFAULTS.weight_decay
    early_stopping: EarlyStoppingSpec | None = EarlyStoppingSpec()
    """null turns early stopping off (on by default in campaigns: thousands of trainings should not run past their best)."""
    validate_every: Count = DEFAULTS.validate_every
    loss: Literal["auto", "mse", "mae", "huber", "smape"] = "auto"
    """auto: the family's recipe (forecasting.recipes): MAE for the built-in networks."""
    schedule: Literal["auto", "constant", "warmup_cosine", "linear"] = "auto"
    """Learning-rate schedule; auto: the family's recipe (constant, with early stopping deciding the length)."""

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _no_false(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise InputError(
                f"early_stopping: {str(value).lower()} is not a setting",
                fix="write early_stopping: null to turn it off, or a mapping such as {patience: 5}",
            )
        return value

    def fit_config(self, overrides: Mapping[str, Any], seed: int) -> FitConfig:
        """The FitConfig of one trial: these settings, the trial's overrides, its seed."""
        unknown = sorted(set(overrides) - TRAIN_KEYS)
        if unknown:
            raise InputError(
                f"{', '.join(map(repr, unknown))} is not a training setting",
                fix=f"override only {', '.join(sorted(TRAIN_KEYS))}",
                field="train",
            )
        merged = self
        if overrides:
            try:
                merged = TrainSpec.model_validate({**self.model_dump(), **overrides})
            except ValidationError as exc:
                first = exc.errors()[0]
                field = dotted(("train", *first["loc"][:1]))
                problem, fix = explain([err for err in exc.errors() if err["loc"][:1] == first["loc"][:1]], field)
                raise InputError(problem, fix=fix, field=field) from None
        stop = merged.early_stopping
        return FitConfig(
            epochs=merged.epochs,
            lr=merged.lr,
            weight_decay=merged.weight_decay,
            batch_size=merged.batch_size,
            precision=merged.precision,
            compile=merged.compile,
            cuda_graph=merged.cuda_graph,
            batch_search=merged.batch_search,
            validate_every=merged.validate_every,
            patience=stop.patience if stop else None,
            min_delta=stop.min_delta if stop else 0.0,
            seed=seed,
            verbose=False,  # a campaign's progress is its live table, not a line per trial's epoch
        )


# --- campaign ----------------------------------------------------------------------------------


class CampaignSpec(Spec):
    """One campaign file. ``models`` holds each family's grid with every value as a list (an axis)."""

    name: str
    """Names the workdir and the report: letters, digits, '_', '.', '-'."""
    data: DataSpec = DataSpec()
    task: TaskSpec = TaskSpec()
    models: dict[str, dict[str, Any]]
    """family -> {key: axis}; see the module docstring."""
    train: TrainSpec = TrainSpec()
    seeds: list[Seed] = [0]
    resources: ResourcesSpec = ResourcesSpec()
    ensemble: EnsembleSpec | None = None
    """The declared ensemble (campaign/ensemble_spec.py): its lookbacks and losses are folded into task and models."""
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
        inspected = inspect_in_child(value, min(task.lookback) if task else None, task.horizon if task else None)
        for family, found in inspected.items():
            if found.get("error"):
                error = found["error"]
                loc = tuple(error["loc"][1:]) if error["loc"] and error["loc"][0] == "models" else tuple(error["loc"])  # relative to models
                raise LocatedError(loc, error["problem"], fix=error["fix"])
        return {family: check_grid(family, grid, TrainSpec, TaskSpec) for family, grid in value.items()}

    @model_validator(mode="after")
    def _check_against_task(self, info: ValidationInfo) -> CampaignSpec:
        if self.data.source == "synthetic":
            check_length(self.data.length, self.task.split.to_split(), lookback=max(self.task.lookback), horizon=self.task.horizon)
        if _checked_already(info):
            return self
        known = self.data.projects if isinstance(self.data.projects, int) else len(self.data.projects) if isinstance(self.data.projects, list) else None
        if self.data.source == "synthetic" and known is None:
            known = SYNTHETIC_DEFAULT_PROJECTS
        self.check_trial_count(known or 1)  # before any grid point is built: a grid of a billion points is refused at once
        for family in self.models:
            check_builds(family, self.models[family], lookback=min(self.task.lookback), horizon=self.task.horizon)
            self._check_recipes(family)
        for index, family in enumerate(self.ensemble.families or [] if self.ensemble else []):
            if family not in self.models:
                raise LocatedError(("ensemble", "families", index), f"ensemble member {family!r} is not a family of models",
                                   fix=f"list families of models ({', '.join(self.models)}), or leave families out for all of them")
        return self

    def ensemble_members(self) -> list[str]:
        """The declared ensemble's member families (none without an ensemble)."""
        if self.ensemble is None:
            return []
        return list(self.ensemble.families or default_members(list(self.models)))

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
        """At most MAX_TRIALS trials (spec_limits.py); `where`: the file:line to name once the spec is loaded."""
        check_trial_count(self.models, len(self.task.lookback), len(self.seeds), projects, one_project=self.task.mode == "global", where=where)

    # -- helpers for the rest of the campaign -----------------------------------------------

    @property
    def base_dir(self) -> Path:
        """Folder that relative data paths resolve against."""
        return self.path.parent if self.path is not None else Path.cwd()

    def kind(self, family: str) -> registry.ModelKind:
        return registry.resolve(family).kind

    def lookbacks(self, family: str) -> list[int]:
        """The lookbacks a family's trials run at. A family that fits the whole series (snaive, ets, theta) reads no
        window, and every lookback's test windows are the same: one trial per project and grid point, at the
        shortest lookback (a lookback grid used to re-run it with identical results)."""
        return [min(self.task.lookback)] if registry.resolve(family).fits_series else list(self.task.lookback)

    def split_point(self, family: str, point: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A grid point as (model params, training and window overrides), each sorted by key."""
        fam = registry.resolve(family)
        params = {k: point[k] for k in sorted(point) if not is_setting(fam, k)}
        train = {k: point[k] for k in sorted(point) if is_setting(fam, k)}
        return params, train

    def recipe(self, family: str, train: Mapping[str, Any]) -> Recipe:
        """How a trial of `family` with these overrides is trained: scaling, loss, schedule (auto: the family's recipe)."""
        return recipe(family, scaling=train.get("scaling", self.task.scaling), loss=train.get("loss", self.train.loss),
                      schedule=train.get("schedule", self.train.schedule))

    def windows(self, project: Project, lookback: int) -> WindowedProject:
        """`project` cut for this task at `lookback` (global mode left-pads a series too short for it)."""
        task = self.task
        return make_windows(project, lookback, task.horizon, task.split.to_split(), task.stride, pad=task.mode == "global")

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
