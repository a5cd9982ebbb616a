"""The campaign file: pydantic models for the YAML and :func:`load_campaign`.

Unknown keys are errors at every level. Every error from :func:`load_campaign` is an
:class:`InputError` naming ``file:line``, the dotted field (``models.lstm.hidden_size``),
the problem and the fix; the line comes from the YAML node tree (``yaml.compose``), the
values from one ``yaml.safe_load``.

Model grids: in ``models: {family: {key: value}}`` a list is a grid axis, a scalar a fixed
value (a one-item axis); a list-valued parameter is written as a one-item axis ``[[64, 32]]``.
In a neural family, the training keys :data:`TRAIN_KEYS` are per-family training overrides
(``lstm: {lr: [1e-3, 3e-4]}``); every other key is a parameter of the family's factory.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import torch
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from gpufill.data import Project, Split, load_projects, split_bounds
from gpufill.errors import InputError
from gpufill.fit import FitConfig
from gpufill.models import registry

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

TRAIN_KEYS = frozenset({"lr", "weight_decay", "batch_size", "epochs"})
"""Training settings a neural family's grid may override (``lstm: {lr: [1e-3, 3e-4]}``)."""

# projects: None on a synthetic source: the data layer's default count.
SYNTHETIC_DEFAULT_PROJECTS = 10
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SYNTHETIC_NAME = re.compile(r"^p(\d+)$")


class _LocatedError(InputError):
    """An InputError raised inside validation that knows the keys below where pydantic saw it."""

    def __init__(self, loc: tuple[str | int, ...], problem: str, *, fix: str):
        self.loc = loc
        super().__init__(problem, fix=fix, field=_dotted(loc) or None)


def _dotted(loc: Iterable[str | int]) -> str:
    """models.lstm.hidden_size: list indices are left out (the line points at the item)."""
    return ".".join(str(part) for part in loc if not isinstance(part, int))


def _number(value: Any) -> Any:
    # pydantic's lax float takes true as 1.0; a bool where a number belongs is a mistake.
    # Strings are left to pydantic: YAML reads 1e-3 (no dot) as the string "1e-3".
    if isinstance(value, bool):
        raise InputError(f"expected a number, got {value!r}", fix="write a number such as 0.001")
    return value


Float = Annotated[float, BeforeValidator(_number)]
Count = Annotated[StrictInt, Field(ge=1)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- data --------------------------------------------------------------------------------------


class DataSpec(_Spec):
    """Where the projects come from and which of them the campaign uses."""

    source: str = "synthetic"
    """"synthetic", a .csv/.parquet file, a directory or a glob; relative to the campaign file."""
    projects: StrictInt | list[str] | str | None = None
    """A count (the first N in name order; synthetic: N generated), a list of names, an fnmatch
    glob over names ("store_*"), or None for all (synthetic: 10)."""
    length: Count = 2000
    """Time steps per synthetic project (synthetic only)."""
    seed: Annotated[StrictInt, Field(ge=0)] = 0
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
        if isinstance(value, str) and not value.strip():
            raise InputError("empty project name or glob", fix="give a name or glob such as 'store_*', or null for all")
        if isinstance(value, list):
            if not value:
                raise InputError("empty list of projects", fix="name at least one project, or set projects: null for all")
            for i, name in enumerate(value):
                if not isinstance(name, str):
                    raise _LocatedError((i,), f"project names are strings, got {name!r}", fix=f"quote it: '{name}'")
            seen = _first_duplicate(value)
            if seen is not None:
                raise _LocatedError((seen,), f"project {value[seen]!r} is listed twice", fix="list each project once")
        return value

    @model_validator(mode="after")
    def _synthetic_only(self) -> DataSpec:
        if self.source != "synthetic":
            # Compared with the default, not "was it set": a dumped spec re-validates (workers do).
            for key in ("length", "seed"):
                if getattr(self, key) != DataSpec.model_fields[key].default:
                    raise _LocatedError((key,), f"{key} applies only to source: synthetic", fix=f"remove {key}: it would be ignored")
        return self

    def load(self, base_dir: Path, *, where: str | None = None) -> dict[str, Project]:
        """The selected projects, keyed and ordered by name.

        Relative paths resolve against ``base_dir`` (the campaign file's folder). ``where``
        names the campaign file in selection errors.
        """
        where = where or "campaign"
        if self.source == "synthetic":
            count = self.projects if isinstance(self.projects, int) else SYNTHETIC_DEFAULT_PROJECTS
            if isinstance(self.projects, list):  # generate far enough to hold every named pNNN
                indices = [int(m[1]) for m in map(_SYNTHETIC_NAME.match, self.projects) if m]
                count = max([count, *(i + 1 for i in indices)])
            loaded = load_projects("synthetic", n_projects=count, length=self.length, seed=self.seed)
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
        unknown = [name for name in wanted if name not in set(available)]
        if unknown:
            raise InputError(
                f"unknown project(s) {', '.join(map(repr, unknown[:5]))}; available: {shown}",
                fix="pick names from the available projects, or set projects: null for all",
                where=where,
                field="data.projects",
            )
        return sorted(wanted)


# --- task --------------------------------------------------------------------------------------


class SplitSpec(_Spec):
    """Validation and test regions at the end of each series: a fraction in [0, 1) or a count."""

    val: StrictInt | Float = 0.1
    test: StrictInt | Float = 0.2
    """Must hold test points: the campaign ranks trials on them."""

    @field_validator("val", "test")
    @classmethod
    def _check_size(cls, value: int | float) -> int | float:
        if isinstance(value, int) and value < 0:
            raise InputError(f"count {value} is negative", fix="give a count >= 0 or a fraction in [0, 1)")
        if isinstance(value, float) and not 0.0 <= value < 1.0:
            raise InputError(f"fraction {value} is outside [0, 1)", fix="give a fraction in [0, 1) or an integer count of time steps")
        return value

    @model_validator(mode="after")
    def _check_total(self) -> SplitSpec:
        if self.test == 0:
            raise _LocatedError(("test",), "test=0 leaves nothing to score trials on", fix="set test to a fraction in (0, 1) or a count >= horizon")
        fractions = [v for v in (self.val, self.test) if isinstance(v, float)]
        if len(fractions) == 2 and sum(fractions) >= 1.0:
            raise _LocatedError(("val",), f"val + test = {sum(fractions):g} leaves nothing to train on", fix="make val + test less than 1 (e.g. val 0.1, test 0.2)")
        return self

    def to_split(self) -> Split:
        return Split(val=self.val, test=self.test)


class TaskSpec(_Spec):
    """What to forecast and how trials are scored."""

    lookback: list[Count] = [30]
    """Input window lengths, a grid axis (a single number is a one-item list)."""
    horizon: Count = 1
    split: SplitSpec = SplitSpec()
    metric: Literal["mae", "rmse", "smape", "mase"] = "mae"
    """Ranks results only; it never changes what is trained."""
    mode: Literal["local", "global"] = "local"
    """local: one model per project; global: one model over all projects."""
    stride: Count = 1
    """Step between training windows."""

    @field_validator("lookback", mode="before")
    @classmethod
    def _one_lookback(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("lookback")
    @classmethod
    def _check_lookbacks(cls, value: list[int]) -> list[int]:
        if not value:
            raise InputError("no lookback given", fix="give at least one window length, e.g. lookback: [30]")
        seen = _first_duplicate(value)
        if seen is not None:
            raise _LocatedError((seen,), f"lookback {value[seen]} is listed twice", fix="list each lookback once")
        return value


# --- training ----------------------------------------------------------------------------------


class EarlyStoppingSpec(_Spec):
    patience: Count = 5
    """Validations without improvement before a training stops."""
    min_delta: Annotated[Float, Field(ge=0)] = 0.0
    """Smallest drop in validation loss that counts as an improvement."""


class TrainSpec(_Spec):
    """Training settings for every neural trial (a family's grid may override TRAIN_KEYS)."""

    epochs: Count = 20
    batch_size: Count | Literal["auto"] = "auto"
    """Effective batch; "auto": the plan picks it for throughput."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    compile: StrictBool | Literal["auto"] = "auto"
    lr: Annotated[Float, Field(gt=0)] = 1e-3
    weight_decay: Annotated[Float, Field(ge=0)] = 0.0
    early_stopping: EarlyStoppingSpec | None = EarlyStoppingSpec()
    """null turns early stopping off."""
    validate_every: Count = 1

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
                field = _dotted(("train", *first["loc"][:1]))
                problem, fix = _explain([err for err in exc.errors() if err["loc"][:1] == first["loc"][:1]], field)
                raise InputError(problem, fix=fix, field=field) from None
        stop = merged.early_stopping
        return FitConfig(
            epochs=merged.epochs,
            lr=merged.lr,
            weight_decay=merged.weight_decay,
            batch_size=merged.batch_size,
            precision=merged.precision,
            compile=merged.compile,
            validate_every=merged.validate_every,
            patience=stop.patience if stop else None,
            min_delta=stop.min_delta if stop else 0.0,
            seed=seed,
        )


_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")


class SlurmSpec(_Spec):
    """Slurm jobs for ``gpufill run --executor slurm`` (through submitit); other executors ignore it.

    One job runs one task (a trial or a fused pack) in a fresh process; jobs submitted in one
    scheduler round go in as one job array.
    """

    cluster: Literal["slurm", "local"] = "slurm"
    """slurm: sbatch job arrays; local: the same jobs as processes on this machine (submitit's
    local executor), to try a campaign or test it without a Slurm cluster."""
    partition: str | None = None
    """Partition to submit to; null: the cluster's default partition."""
    timeout_min: Count = 60
    """Wall-clock limit of one job, in minutes; a job that hits it is retried like a crashed worker."""
    gpus_per_job: Annotated[StrictInt, Field(ge=0, le=1)] = 1
    """GPUs for each neural job (1: a trial or pack trains on one GPU; 0: neural trials run on CPUs).
    Classical jobs never ask for a GPU."""
    cpus_per_task: Count = 1
    """CPU cores of each job, and the threads its trial uses (torch, BLAS, XGBoost, LightGBM)."""
    mem_gb: Annotated[Float, Field(gt=0)] | None = None
    """Memory per job in GB; null: the partition's default."""
    max_jobs: Count = 32
    """Jobs queued or running at once per lane (Slurm queues the rest of a big array anyway;
    this keeps the queue short so a re-run or a change of plan waits on few jobs)."""
    sbatch: dict[str, StrictInt | Float | str | StrictBool] = {}
    """Extra ``#SBATCH`` options by long name without dashes, e.g. ``{account: proj42, qos: high, constraint: a100}``."""

    @field_validator("sbatch")
    @classmethod
    def _check_sbatch(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _SBATCH_KEY.match(key):
                raise _LocatedError((key,), f"{key!r} is not an sbatch option name", fix="write the long option without dashes, in lower case, e.g. account, qos, constraint, mail-type")
        return value


class ResourcesSpec(_Spec):
    """How much of the machine the campaign may use. Never part of a trial's identity."""

    gpu_slots: Count | Literal["auto"] = "auto"
    """Trainings (or packs) running at once on the GPU lane."""
    cpu_slots: Count | Literal["auto"] = "auto"
    """Classical trials running at once on the CPU lane."""
    retries: Annotated[StrictInt, Field(ge=0)] = 2
    """Extra attempts for a failed trial."""
    memory_margin: Annotated[Float, Field(gt=0, le=1)] = 0.85
    """Share of device memory the GPU lane may plan to use."""
    threads_per_trial: Count | Literal["auto"] = "auto"
    """CPU threads per classical trial; "auto" keeps slots x threads <= cores."""
    pack_size: Count | Literal["auto"] = "auto"
    """Neural trials of one shape fused into one pack: "auto" measures per shape and device; 1 turns fusion off."""
    slurm: SlurmSpec = SlurmSpec()
    """Job settings for ``--executor slurm``."""


# --- campaign ----------------------------------------------------------------------------------


class CampaignSpec(_Spec):
    """One campaign file. ``models`` holds each family's grid with every value as a list (an axis)."""

    name: str
    """Names the workdir and the report: letters, digits, '_', '.', '-'."""
    data: DataSpec = DataSpec()
    task: TaskSpec = TaskSpec()
    models: dict[str, dict[str, Any]]
    """family -> {key: axis}; see the module docstring."""
    train: TrainSpec = TrainSpec()
    seeds: list[Annotated[StrictInt, Field(ge=0)]] = [0]
    resources: ResourcesSpec = ResourcesSpec()
    path: Path | None = Field(default=None, exclude=True)
    """The file this spec was loaded from (relative data paths resolve against its folder)."""

    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)

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
        seen = _first_duplicate(value)
        if seen is not None:
            raise _LocatedError((seen,), f"seed {value[seen]} is listed twice", fix="list each seed once (a repeat would train the same trial twice)")
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
    def _check_models(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
        if not value:
            raise InputError("no model families given", fix="add at least one family, e.g. models: {lstm: {hidden_size: [64]}}")
        return {family: _check_grid(family, grid) for family, grid in value.items()}

    @model_validator(mode="after")
    def _check_against_task(self) -> CampaignSpec:
        if self.data.source == "synthetic":
            _check_length(self.data.length, self.task)
        for family in self.models:
            _check_builds(family, self.models[family], self.task)
        return self

    # -- helpers for the rest of the campaign -----------------------------------------------

    @property
    def base_dir(self) -> Path:
        """Folder that relative data paths resolve against."""
        return self.path.parent if self.path is not None else Path.cwd()

    def kind(self, family: str) -> registry.ModelKind:
        return registry.resolve(family).kind

    def split_point(self, family: str, point: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A grid point as (model params, training overrides), each sorted by key."""
        neural = self.kind(family) == "neural"
        params = {k: point[k] for k in sorted(point) if not (neural and k in TRAIN_KEYS)}
        train = {k: point[k] for k in sorted(point) if neural and k in TRAIN_KEYS}
        return params, train

    def where(self, *loc: str | int) -> str:
        """``file:line`` of the deepest key of ``loc`` present in the file (the file alone if unknown)."""
        if self.path is None:
            return "campaign"
        return f"{self.path}:{_line_of(loc, self._lines)[1]}" if self._lines else str(self.path)

    def load_projects(self) -> dict[str, Project]:
        """The campaign's projects (``data.load`` with this file's folder and location)."""
        return self.data.load(self.base_dir, where=self.where("data", "projects"))

    def fit_config(self, train: Mapping[str, Any], seed: int) -> FitConfig:
        """A trial's FitConfig: train settings + overrides + seed, and resources.memory_margin."""
        config = self.train.fit_config(train, seed)
        config.memory_margin = self.resources.memory_margin
        return config


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and check a campaign file; any problem is an InputError naming ``file:line``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("campaign file not found", fix="check the path (relative paths are from the current directory)", where=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a campaign file", fix="point to the campaign's .yaml file", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the file ({type(exc).__name__}: {exc})", fix="check the file's permissions and that it is UTF-8 text", where=str(path)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if "<stream end>" in str(getattr(exc, "problem", "")) and getattr(exc, "context_mark", None) is not None:
            mark = exc.context_mark  # an unclosed bracket: point at where it opened, not at the end of the file
        line = mark.line + 1 if mark is not None else 1
        problem = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part) or str(exc)
        context = getattr(exc, "context_mark", None)
        opened = f" (what it parses began at line {context.line + 1})" if context is not None and context.line + 1 != line else ""
        raise InputError(
            f"not valid YAML: {problem}{opened}",
            fix=f"fix the YAML syntax at line {line} (indentation, a missing ':' or an unclosed quote or bracket)",
            where=f"{path}:{line}",
        ) from None
    if root is None:
        raise InputError("the file is empty", fix="write a campaign: name, models, and optionally data, task, train, seeds, resources", where=f"{path}:1")
    if not isinstance(data, dict):
        raise InputError(
            f"the top level is a {type(data).__name__}, not a mapping of keys",
            fix="start the file with keys such as 'name: my_campaign' and 'models:'",
            where=f"{path}:{root.start_mark.line + 1}",
        )
    lines = _line_index(root, str(path))
    if "path" in data:  # a field of the spec, but set from where the file is, never in it
        raise InputError("unknown key 'path'", fix=f"remove it; allowed keys: {', '.join(_allowed(()))}", where=f"{path}:{lines[('path',)]}", field="path")
    try:
        spec = CampaignSpec.model_validate({**data, "path": path})
    except ValidationError as exc:
        raise _to_input_error(exc, lines, str(path)) from None
    spec._lines = lines
    return spec


# --- grid checks -------------------------------------------------------------------------------


def _check_grid(family: str, grid: dict[str, Any]) -> dict[str, list[Any]]:
    """One family's grid with every value an axis; training values validated and coerced."""
    try:
        fam = registry.resolve(family)
    except InputError as exc:
        raise _LocatedError((family,), exc.problem, fix=exc.fix) from None
    axes: dict[str, list[Any]] = {}
    for key, value in grid.items():
        values = list(value) if isinstance(value, list) else [value]
        if not values:
            default = fam.defaults.get(key, "...")
            raise _LocatedError((family, key), f"empty grid for {key!r}: [] gives no trials", fix=f"give at least one value, e.g. {key}: [{default}], or remove {key} to use the default")
        if key in TRAIN_KEYS and fam.kind == "neural":
            values = [_training_value(family, key, i if isinstance(value, list) else None, v) for i, v in enumerate(values)]
        elif key in TRAIN_KEYS and key not in fam.defaults:
            raise _LocatedError(
                (family, key),
                f"{key!r} is a training setting, but {family!r} is a classical model",
                fix=f"remove {key} from {family}: classical models have no lr, weight_decay, batch_size or epochs",
            )
        else:
            _check_param(fam, key)
        seen = _first_duplicate(values)
        if seen is not None:
            raise _LocatedError((family, key, seen), f"value {values[seen]!r} appears twice in the grid of {key!r}", fix="list each value once (a repeat would train the same trial twice)")
        axes[key] = values
    return axes


def _check_param(fam: registry.Family, key: str) -> None:
    try:
        registry.check_params(fam.name, {key: None})
    except InputError:
        close = difflib.get_close_matches(key, [*fam.defaults, *(TRAIN_KEYS if fam.kind == "neural" else ())], n=1)
        accepted = ", ".join(fam.defaults) or "none"
        training = f"; training settings: {', '.join(sorted(TRAIN_KEYS))}" if fam.kind == "neural" else ""
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _LocatedError(
            (fam.name, key),
            f"unknown parameter {key!r} for model family {fam.name!r}; accepted: {accepted}{training}",
            fix=f"{hint}rename or remove {key}",
        ) from None


def _training_value(family: str, key: str, index: int | None, value: Any) -> Any:
    loc = (family, key) if index is None else (family, key, index)
    try:
        return getattr(TrainSpec.model_validate({key: value}), key)
    except ValidationError as exc:
        problem, fix = _explain(exc.errors(), f"models.{family}.{key}")
        raise _LocatedError(loc, problem, fix=fix) from None


def _check_builds(family: str, axes: Mapping[str, list[Any]], task: TaskSpec) -> None:
    """Build every grid point once (training axes aside), so bad values fail at load time."""
    fam = registry.resolve(family)
    model_axes = {k: v for k, v in axes.items() if not (fam.kind == "neural" and k in TRAIN_KEYS)}
    for combo in itertools.product(*model_axes.values()):
        params = dict(zip(model_axes, combo))
        # Building initialises weights: keep the caller's global RNG untouched.
        with torch.random.fork_rng(devices=[]):
            try:
                registry.build(family, n_features=1, lookback=min(task.lookback), horizon=task.horizon, params=params)
            except InputError as exc:
                key = str(exc.field or "").rpartition(".")[2]
                loc = ("models", family, key) if key in params else ("models", family)
                raise _LocatedError(loc, f"{family} with {_show(params)}: {exc.problem}", fix=exc.fix) from None
            except Exception as exc:  # a user factory may raise anything: report it as bad input
                raise _LocatedError(
                    ("models", family),
                    f"building {family} with {_show(params)} failed: {type(exc).__name__}: {exc}",
                    fix=f"change the values in {family}'s grid to ones its factory accepts",
                ) from None


def _check_length(length: int, task: TaskSpec) -> None:
    """A synthetic series must hold a training window and a horizon of val and test points."""
    split = task.split.to_split()
    try:
        train_end, val_end = split_bounds(length, split)
    except InputError as exc:
        raise _LocatedError(("task", "split"), exc.problem, fix=exc.fix) from None
    longest = max(task.lookback)
    if train_end < longest + task.horizon:
        raise _LocatedError(
            ("task", "lookback"),
            f"lookback {longest} + horizon {task.horizon} does not fit the {train_end} training steps of a synthetic series of length {length}",
            fix=f"lower the lookback or raise data.length above {length}",
        )
    for name, size in (("val", val_end - train_end), ("test", length - val_end)):
        if 0 < size < task.horizon or (name == "test" and size == 0):
            raise _LocatedError(("task", "split", name), f"split.{name} holds {size} steps, fewer than horizon {task.horizon}", fix=f"raise split.{name} or lower the horizon")


# --- errors: pydantic -> InputError at file:line -------------------------------------------------


def _line_index(root: yaml.Node, where: str) -> dict[tuple[str | int, ...], int]:
    """1-based line of every key and sequence item, by path; a duplicate key is an error."""
    lines: dict[tuple[str | int, ...], int] = {(): root.start_mark.line + 1}

    def walk(node: yaml.Node, prefix: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                path = (*prefix, key_node.value)
                line = key_node.start_mark.line + 1
                if path in lines:
                    raise InputError(
                        f"duplicate key {key_node.value!r} (also at line {lines[path]})",
                        fix="keep one of them: YAML would silently use only the last",
                        where=f"{where}:{line}",
                        field=".".join(map(str, path)),
                    )
                lines[path] = line
                walk(value_node, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*prefix, i)] = item.start_mark.line + 1
                walk(item, (*prefix, i))

    walk(root, ())
    return lines


def _line_of(loc: Iterable[str | int], lines: Mapping[tuple[str | int, ...], int]) -> tuple[tuple[str | int, ...], int]:
    """(the parts of loc present in the file, the line of the deepest one).

    Parts not in the file are skipped: pydantic's union tags ('int', "literal['auto']"),
    a key that is missing, or an index into a scalar that became a one-item list.
    """
    path: tuple[str | int, ...] = ()
    for part in loc:
        for candidate in ((*path, part), (*path, str(part))):
            if candidate in lines:
                path = candidate
                break
    return path, lines[path]


def _to_input_error(exc: ValidationError, lines: Mapping[tuple[str | int, ...], int], where: str) -> InputError:
    """The first problem in file order (an unknown key before a missing one) as an InputError."""
    found = []
    for order, err in enumerate(exc.errors()):
        cause = (err.get("ctx") or {}).get("error")
        loc = tuple(err["loc"]) + tuple(getattr(cause, "loc", ()))
        path, line = _line_of(loc, lines)
        if err["type"] == "missing":
            path = (*path, loc[-1])
        found.append((err["type"] == "missing", line, order, path, err))
    missing, line, _, path, first = min(found, key=lambda item: item[:3])
    field = _dotted(path)
    if first["type"] == "missing":
        parent = f"under {'.'.join(map(str, path[:-1]))}" if len(path) > 1 else "at the top level"
        problem, fix = f"missing required key {path[-1]!r}", f"add '{path[-1]}:' {parent}"
    elif first["type"] == "extra_forbidden":
        key = str(path[-1])
        allowed = _allowed(path[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problem, fix = f"unknown key {key!r}", f"{hint}allowed keys here: {', '.join(allowed)}"
    else:
        group = [item[4] for item in found if item[3] == path and not item[0]]
        problem, fix = _explain(group, field)
        if path[:1] == ("models",) and first["type"] == "dict_type":
            example = "{lstm: {hidden_size: [64, 128]}}" if len(path) == 1 else "{hidden_size: [64, 128], num_layers: 2}"
            fix = f"write {field} as a mapping, e.g. {example} (a list is a grid axis, a scalar a fixed value)"
    return InputError(problem, fix=fix, where=f"{where}:{line}", field=field or None)


def _explain(errors: list[dict[str, Any]], field: str) -> tuple[str, str]:
    """(problem, fix) for the errors pydantic raised on one value (several: one per union member)."""
    for err in errors:
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, InputError):
            return cause.problem, cause.fix
        if err["type"] == "invalid_key":
            return f"key {_show(err.get('input'))} is not a name", "write the key as a name (quote a number: '1':)"
        if err["type"] == "value_error":
            return str(cause or err["msg"]), f"correct {field}"
    wanted = list(dict.fromkeys(_expected(err) for err in errors))
    expected = " or ".join(wanted)
    return f"expected {expected}, got {_show(errors[0].get('input'))}", f"set {field} to {expected}"


def _expected(err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    for name, op in bounds.items():
        if kind == name:
            return f"a value {op} {next(iter(ctx.values()))}"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        return f"one of {expected}" if "," in expected or " or " in expected else expected
    names = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "string": "a string",
        "list": "a list",
        "dict": "a mapping",
        "model": "a mapping",
        "none": "null",
    }
    prefix = kind.split("_")[0]
    return names.get(prefix, err["msg"].removeprefix("Input should be "))


def _allowed(loc: tuple[str | int, ...]) -> list[str]:
    """Keys allowed in the mapping at ``loc`` (field names of the spec model found there)."""
    model: type[BaseModel] | None = CampaignSpec
    for part in loc:
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is not None:
            model = _model_in(field.annotation)
    if model is None:
        return []
    return [name for name in model.model_fields if not (model is CampaignSpec and name == "path")]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _first_duplicate(values: list[Any]) -> int | None:
    """Index of the first value equal to an earlier one (1 == 1.0 counts), or None."""
    for i, value in enumerate(values):
        if any(_same(value, earlier) for earlier in values[:i]):
            return i
    return None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)
    except Exception:  # values whose == is not a bool (arrays): never duplicates
        return False


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
