"""The campaign file's `data:` section: where the projects come from and which of them the campaign uses."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import StrictInt, field_validator, model_validator

from gpufill.campaign.spec.spec_errors import LocatedError, first_duplicate
from gpufill.campaign.spec.spec_limits import Length, Seed, check_project_count, check_synthetic
from gpufill.campaign.spec.spec_types import Count, Spec
from gpufill.errors import InputError
from gpufill.forecasting.data import Project, load_projects

SYNTHETIC_DEFAULT_PROJECTS = 10
"""projects: None on a synthetic source: the data layer's default count."""
_SYNTHETIC_NAME = re.compile(r"^p(\d+)$")


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
                raise InputError(f"asks for {wanted} projects but the source has {len(available)}",
                                 fix=f"set data.projects to at most {len(available)}, or null for all", where=where, field="data.projects")
            return available[:wanted]
        if isinstance(wanted, str):
            matched = [name for name in available if fnmatch.fnmatchcase(name, wanted)]
            if not matched:
                raise InputError(f"pattern {wanted!r} matches no project; available: {shown}",
                                 fix="change the pattern (fnmatch: * any text, ? one character), or set projects: null for all", where=where, field="data.projects")
            return matched
        known = set(available)  # once: a list of 20,000 names is checked in linear time
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise InputError(f"unknown project(s) {', '.join(map(repr, unknown[:5]))}; available: {shown}",
                             fix="pick names from the available projects, or set projects: null for all", where=where, field="data.projects")
        return sorted(wanted)
