"""Sizes a campaign file may ask for. Past them gpufill would work for minutes, or fill the machine's memory, before
printing anything: each is refused at load with its limit named (issue 26, class 8)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, StrictInt

from gpufill.campaign.spec.spec_errors import LocatedError
from gpufill.campaign.spec.spec_types import SCIENTIFIC, at_most
from gpufill.errors import InputError

__all__ = ["MAX_LENGTH", "MAX_PROJECTS", "MAX_SEED", "MAX_SYNTHETIC_STEPS", "MAX_TRIALS", "Seed", "check_grid_points", "check_project_count",
           "check_synthetic", "check_trial_count"]

MAX_PROJECTS = 100_000
"""data.projects as a count (synthetic: generated; a file: its first N)."""
MAX_LENGTH = 10_000_000
"""data.length of a synthetic series (10 million steps: 240 MB with its two covariates)."""
MAX_SYNTHETIC_STEPS = 100_000_000
"""data.projects x data.length of synthetic data (2.4 GB of float64 with the covariates)."""
MAX_TRIALS = 2_000_000
"""Trials in one campaign (36,000 register in seconds; each is a row and, while it is listed, ~0.5 KB of memory)."""
MAX_SEED = 2**32 - 1
"""Seeds are unsigned 32-bit: numpy's legacy generator and scikit-learn refuse a larger one at run time."""

Seed = Annotated[StrictInt, Field(ge=0), at_most(MAX_SEED, "seeds are unsigned 32-bit integers")]
Length = at_most(MAX_LENGTH, "time steps of a synthetic series")


def check_project_count(value: Any) -> None:
    """data.projects given as a count."""
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_PROJECTS:
        raise InputError(f"{value:,} projects is more than the {MAX_PROJECTS:,} gpufill allows", fix=f"use at most {MAX_PROJECTS:,} projects")


def check_synthetic(projects: Any, count: int, length: int) -> None:
    """Synthetic data: `projects` as written, `count` the projects it generates, each `length` steps long."""
    if isinstance(projects, str) and SCIENTIFIC.match(projects.strip()):  # YAML reads 1e8 as text: it was meant as a count
        raise LocatedError(("projects",), f"{projects!r} is text to YAML (a pattern no synthetic name matches), not a count",
                           fix=f"write the count in digits, at most {MAX_PROJECTS:,}")
    if count > MAX_PROJECTS:  # names such as p99999999 would generate every project before them
        raise LocatedError(("projects",), f"naming project p{count - 1} generates {count:,} projects, more than the {MAX_PROJECTS:,} gpufill allows",
                           fix=f"name synthetic projects up to p{MAX_PROJECTS - 1}")
    if count * length > MAX_SYNTHETIC_STEPS:
        raise LocatedError(("projects",), f"{count:,} projects x length {length:,} = {count * length:,} time steps is more than "
                           f"the {MAX_SYNTHETIC_STEPS:,} gpufill generates", fix="lower data.projects or data.length")


def check_grid_points(models: Mapping[str, Any]) -> None:
    """The model grids as written (a list is an axis): refused before any point is built, here or in the inspection child."""
    points = sum(math.prod(len(axis) if isinstance(axis, list) else 1 for axis in grid.values()) for grid in models.values() if isinstance(grid, Mapping))
    if points > MAX_TRIALS:
        raise LocatedError((), f"the grids hold {points:,} points, more than the {MAX_TRIALS:,} trials gpufill runs in one campaign",
                           fix="use fewer values per grid axis, or split the campaign into several files")


def check_trial_count(models: Mapping[str, Mapping[str, list[Any]]], lookbacks: int, seeds: int, projects: int, *, one_project: bool,
                      where: str | None = None) -> None:
    """Grid points x lookbacks x seeds x projects (`one_project`: global mode, one trial over all of them) at most MAX_TRIALS.
    `where`: the file:line to name once the spec is loaded (while it validates, the error finds its line itself)."""
    points = sum(math.prod(len(axis) for axis in grid.values()) for grid in models.values())
    total = points * lookbacks * seeds * (1 if one_project else projects)
    if total <= MAX_TRIALS:
        return
    problem = (f"{points:,} grid points x {lookbacks} lookbacks x {seeds} seeds" + (f" x {projects:,} projects" if not one_project and projects > 1 else "")
               + f" = {total:,} trials, more than the {MAX_TRIALS:,} gpufill runs in one campaign")
    fix = "use fewer values per grid axis, lookbacks, seeds or projects, or split the campaign into several files"
    if where is not None:
        raise InputError(problem, fix=fix, where=where, field="models")
    raise LocatedError(("models",), problem, fix=fix)
