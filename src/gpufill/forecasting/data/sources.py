"""Load projects from "synthetic", a .csv/.parquet file, a directory or a glob pattern.

Layouts: one file per project (file stem = project name), or one file holding many
projects split by ``project_column``. Shards ``NAME_part1.csv``, ``NAME_part2.csv``, ...
are merged in numeric order (part10 after part9) before anything else. Each project's rows
become a Project in series.py (time order, covariates, fills, value checks), all of a file's projects at once
in tables.py.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from pathlib import Path

import numpy as np

from gpufill.forecasting.data.checks import MAX_ABS_VALUE, Rows
from gpufill.forecasting.data.project import Project
from gpufill.forecasting.data.series import FILLS, TIME_NAMES
from gpufill.forecasting.data.tables import Table, to_projects
from gpufill.forecasting.data.synthetic import synthetic_projects
from gpufill.errors import InputError
from gpufill.files import not_regular

if TYPE_CHECKING:
    import pandas as pd

_EXTENSIONS = (".csv", ".parquet")
_SHARD = re.compile(r"^(?P<name>.+)_part(?P<num>\d+)$")
_FORMS = "'synthetic', a .csv or .parquet file, a directory of them, or a glob such as 'data/*.csv'"
__all__ = ["FILLS", "MAX_ABS_VALUE", "load_projects"]


def load_projects(
    source: str = "synthetic",
    *,
    target: str = "target",
    project_column: str = "project",
    time_column: str | None = None,
    projects: Sequence[str] | None = None,
    fill: str = "none",
    n_projects: int = 10,
    length: int = 2000,
    seed: int = 0,
) -> dict[str, Project]:
    """Projects keyed (and ordered) by name.

    ``time_column=None`` uses a column named time/date/timestamp if there is one, else row order.
    ``fill``: "none" (NaN is an error), "ffill" (then back-fill, so leading NaNs take the first
    value), "interpolate" (linear in row order; ends take the nearest value) or "zero".
    ``n_projects``, ``length`` and ``seed`` apply only to ``source="synthetic"``.
    """
    if fill not in FILLS:
        raise InputError(f"unknown fill {fill!r}",
                         fix=f"set fill to one of {', '.join(FILLS)}", where="load_projects", field="fill")
    if isinstance(projects, str):  # a lone name, not its characters
        projects = [projects]
    source = os.fspath(source)
    if source == "synthetic":
        loaded = synthetic_projects(n_projects=n_projects, length=length, seed=seed)
        names = _select(source, sorted(loaded), projects)
        return {name: loaded[name] for name in names}

    owners = _tables(_resolve(source), project_column)
    names = _select(source, sorted(owners), projects)
    return to_projects(owners, names, target, time_column, project_column, fill)


def _resolve(source: str) -> list[Path]:
    """The data files a source string names."""
    if "://" in source:
        raise InputError("remote URLs are not read directly",
                         fix=f"download the data first; source must be {_FORMS}", where=source, field="source")
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in _EXTENSIONS)
        if not files:
            raise InputError("directory holds no .csv or .parquet files",
                             fix="point source at a directory with .csv/.parquet files, or at a file or glob", where=source, field="source")
        return files
    if path.is_file():
        _check_extension(path, source)
        return [path]
    if path.exists():  # a pipe, socket or device: reading it could wait forever (a FIFO with no writer)
        raise not_regular(path, field="source")
    if any(char in source for char in "*?["):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(source), recursive=True) if Path(p).is_file())
        if not matches:
            raise InputError("glob pattern matches no files",
                             fix=f"check the pattern; source must be {_FORMS}", where=source, field="source")
        files = [p for p in matches if p.suffix.lower() in _EXTENSIONS]
        if not files:
            _check_extension(matches[0], source)
        return files  # non-data files matched by a broad glob (README, .json) are skipped
    if path.suffix.lower() in _EXTENSIONS:
        raise InputError("no such file",
                         fix="check the path (relative paths are from the current directory)", where=source, field="source")
    raise InputError("unknown source: not 'synthetic', not an existing file or directory, not a glob pattern",
                     fix=f"set source to {_FORMS}", where=source, field="source")


def _check_extension(path: Path, source: str) -> None:
    if path.suffix.lower() not in _EXTENSIONS:
        raise InputError(f"unsupported file type {path.suffix or '(no extension)'!r} ({path.name})",
                         fix="convert the data to .csv or .parquet", where=source, field="source")


def _shard_groups(files: list[Path]) -> dict[str, list[Path]]:
    """Group files by project stem; shards are ordered by part number and checked for gaps."""
    groups: dict[str, list[tuple[int | None, Path]]] = {}
    for path in files:
        match = _SHARD.match(path.stem)
        name, num = (match["name"], int(match["num"])) if match else (path.stem, None)
        groups.setdefault(name, []).append((num, path))
    out: dict[str, list[Path]] = {}
    for name, members in groups.items():
        nums = [num for num, _ in members]
        if len(members) > 1 and (None in nums or len(set(nums)) < len(nums)):
            listed = ", ".join(str(path) for _, path in members)
            raise InputError(f"several files hold project {name!r}: {listed}",
                             fix="keep one file per project, or name shards NAME_part1, NAME_part2, ... with distinct numbers", where=str(members[0][1].parent), field="source")
        if nums == [None]:
            out[name] = [members[0][1]]
            continue
        members.sort(key=lambda member: member[0])  # numeric: part10 after part9
        first = members[0][1]
        missing = sorted(set(range(1, max(nums) + 1)) - set(nums))
        if missing:
            missing_paths = ", ".join(str(first.with_name(f"{name}_part{n}{first.suffix}")) for n in missing[:5])
            problem = "shard numbering must start at part1" if 1 in missing else "gap in shard numbering"
            raise InputError(f"{problem}: missing {missing_paths}",
                             fix=f"add the missing shard(s) or renumber {name}_partN files as 1, 2, 3, ...", where=str(first), field="source")
        out[name] = [path for _, path in members]
    return out


def _read(path: Path, project_column: str) -> pd.DataFrame:
    import pandas as pd  # pandas and pyarrow load here, not at import: a synthetic campaign's scheduler never needs them
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".csv":
            # Project ids are text as written: "007" and "7" are two projects, "0042" stays "0042" (and "NA" a name).
            frame = pd.read_csv(path, converters={project_column: str})
        else:
            _refuse_nested(path)
            frame = pd.read_parquet(path, engine="pyarrow")
    except InputError:  # a nested column: its own line
        raise
    except pd.errors.EmptyDataError:
        raise InputError(
            "file is empty", fix="write a header and rows to the file, or remove it", where=str(path)
        ) from None
    except (OSError, ValueError, pa.ArrowException) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise InputError(
            f"cannot read file ({type(exc).__name__}: {detail})",
            fix=f"check that it is a valid {path.suffix.lstrip('.')} file (re-export it), or remove it",
            where=str(path),
        ) from exc
    if len(frame) == 0:
        raise InputError(
            f"file has columns {[str(c) for c in frame.columns]} but no rows",
            fix="add data rows to the file, or remove it",
            where=str(path),
        )
    return frame


def _merge_shards(paths: list[Path], project_column: str) -> tuple[pd.DataFrame, str, Rows]:
    """Read and concatenate shards; return the frame, a label naming the file(s) and where each row came from."""
    import pandas as pd

    frames = [_read(path, project_column) for path in paths]
    rows = Rows(tuple((path, len(frame)) for path, frame in zip(paths, frames)))
    if len(paths) == 1:
        return frames[0], str(paths[0]), rows
    head = list(frames[0].columns)
    for path, frame in zip(paths[1:], frames[1:]):
        if list(frame.columns) != head:
            raise InputError(f"columns {[str(c) for c in frame.columns]} differ from {paths[0].name}'s {[str(c) for c in head]}",
                             fix="give every shard of a project the same columns in the same order", where=str(path), field="columns")
    stem = _SHARD.match(paths[0].stem)["name"]
    label = str(paths[0].with_name(f"{stem}_part{{1..{len(paths)}}}{paths[0].suffix}"))
    return pd.concat(frames, ignore_index=True), label, rows


def _refuse_nested(path: Path) -> None:
    """A Parquet column of lists, structs or maps holds no series values: one line naming it (its schema only is read)."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    nested = [field for field in schema if field.type.num_fields > 0]  # list, large_list, fixed-size list, struct, map, union
    if nested:
        field = nested[0]
        raise InputError(f"column {field.name!r} holds {field.type} values, not one number or name per row", where=str(path), field=field.name,
                         fix=f"flatten {field.name!r} into one column per element (or drop it) and write the file again")


def _tables(files: list[Path], project_column: str) -> dict[str, tuple[Table, int]]:
    """name -> the table holding the project (a file or set of shards, read once) and the project's code in it."""
    import pandas as pd

    out: dict[str, tuple[Table, int]] = {}
    for stem, paths in _shard_groups(files).items():
        frame, label, rows = _merge_shards(paths, project_column)
        if project_column in frame.columns:
            keys = frame[project_column]
            missing = keys.isna() | (keys.astype(str).str.strip() == "")
            if missing.any():
                raise InputError(f"{int(missing.sum())} rows have no project name (the first at {rows.name(int(np.flatnonzero(missing.to_numpy())[0]))})",
                                 fix=f"fill in {project_column!r} on every row, or drop those rows", where=label, field=project_column)
            codes, names = pd.factorize(keys.astype(str), sort=False)  # one pass, names in order of first appearance
            table = Table.of(frame, label, True, rows, codes.astype(np.int64), tuple(map(str, names)))
        else:
            _refuse_hidden_projects(frame, label, project_column)
            table = Table.of(frame, label, False, rows, np.zeros(len(frame), dtype=np.int64), (stem,))
        for code, name in enumerate(table.names):
            if name in out:
                raise InputError(f"project {name!r} appears both here and in {out[name][0].label}",
                                 fix="give every project one file (or one set of shards), or distinct names", where=label, field=project_column if table.split else "source")
            out[name] = (table, code)
    return out


def _refuse_hidden_projects(frame: pd.DataFrame, label: str, project_column: str) -> None:
    """A text column that splits the rows into a few long runs (or repeats the timestamps per value) holds
    several series: read as one, they would be silently mixed."""
    import pandas as pd

    n = len(frame)
    times = [c for c in frame.columns if str(c).lower() in TIME_NAMES]
    for column in frame.columns:
        values = frame[column]
        if column in times or pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        distinct = values.nunique(dropna=True)
        if not 2 <= distinct <= n // 2:
            continue
        blocks = int((values != values.shift()).sum())  # a project column comes in runs; a weekday cycles
        stamps_repeat = bool(times) and frame[times[0]].duplicated().any() and not frame[[times[0], column]].duplicated().any()
        if blocks <= 2 * distinct or stamps_repeat:
            raise InputError(
                f"column {str(column)!r} looks like a project id ({distinct} text values, about {n // distinct} rows each), "
                f"but no {project_column!r} column splits the file, so its series would be read as one",
                fix=f"set data.project_column: {column} (or remove the column if it is not a series id)",
                where=label,
                field="project_column",
            )


def _select(source: str, available: list[str], wanted: Sequence[str] | None) -> list[str]:
    if wanted is None:
        return available
    wanted = list(dict.fromkeys(str(name) for name in wanted))  # de-duplicate, keep order for the message
    if not wanted:
        raise InputError("no project names given",
                         fix="pass at least one project name, or projects=None for all", where=source, field="projects")
    unknown = [name for name in wanted if name not in set(available)]
    if unknown:
        shown = ", ".join(available[:5]) + (f", ... ({len(available)} in all)" if len(available) > 5 else "")
        raise InputError(f"unknown project(s) {', '.join(map(repr, unknown[:5]))}; available: {shown}",
                         fix="pick names from the available projects, or leave projects unset to load all", where=source, field="projects")
    return sorted(wanted)
