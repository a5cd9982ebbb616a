"""A file (or set of shards) that a project column splits into many projects, turned into Projects at once.

A frame per project, its column lookups and its sort cost about a millisecond each in pandas: 20,000 one-row
projects took about a minute to load. Here the table is converted to float64, sorted by (project, time) and checked
once; each project is then a slice of numpy arrays that goes through series.finish (fingerprint, fill, value checks)
like any other. The fingerprint hashes the same cells in the same order, so project ids and trial ids are unchanged.

Whatever these table-wide checks cannot settle goes to series.to_project, the one reader of a single project's frame,
so every refusal is the same line as before: a project they flag (a time given twice or missing or not a date, a text
cell in a numeric column), and every project of a table that needs reading project by project (no target column, a
text target, a column of an unusual dtype). Projects are built in name order either way, so the first refusal is
the same one too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpufill.forecasting.data.checks import Rows
from gpufill.forecasting.data.project import Project
from gpufill.forecasting.data.series import (
    covariates,
    find_time_column,
    finish,
    numeric_target,
    parse_dates,
    project_where,
    to_project,
)

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class Table:
    """One file (or set of shards) as read, and the project each of its rows belongs to."""

    frame: pd.DataFrame
    label: str
    """The file(s), as refusals name them."""
    split: bool
    """Whether the project column split it (else it is one project, named after the file)."""
    rows: Rows
    codes: np.ndarray
    """(rows,) each row's project, an index into `names`."""
    names: tuple[str, ...]
    """Project names in order of first appearance."""
    grouped: np.ndarray
    """Row positions grouped by project, in file order within each: project k's are grouped[bounds[k]:bounds[k + 1]]."""
    bounds: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, label: str, split: bool, rows: Rows, codes: np.ndarray, names: tuple[str, ...]) -> Table:
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(names)))])
        return cls(frame, label, split, rows, codes, names, np.argsort(codes, kind="stable"), bounds)

    def part(self, code: int, project_column: str) -> pd.DataFrame:
        """One project's rows in file order, indexed by their position in the file: what series.to_project reads."""
        if not self.split:
            return self.frame
        return self.frame.iloc[self.grouped[self.bounds[code]:self.bounds[code + 1]]].drop(columns=project_column)


@dataclass(frozen=True, slots=True)
class _Cells:
    """A split table's numeric cells, rows sorted by (project, time)."""

    values: np.ndarray
    """(rows, 1 + C) float64: the target, then the covariates."""
    names: list[str]
    positions: np.ndarray
    """Each sorted row's index label in the table (its position in the file), for messages that name a row."""
    time: np.ndarray | None
    settled: np.ndarray
    """(projects,) bool: False where series.to_project must read the project (it refuses it, naming the row)."""


def to_projects(
    owners: dict[str, tuple[Table, int]],
    names: list[str],
    target: str,
    time_column: str | None,
    project_column: str,
    fill: str,
) -> dict[str, Project]:
    """The named projects (each owned by a table, at a code), built in the order given."""
    cells: dict[int, _Cells | None] = {}
    out: dict[str, Project] = {}
    for name in names:
        table, code = owners[name]
        if table.split and id(table) not in cells:
            cells[id(table)] = _cells(table, target, time_column, project_column)
        found = cells.get(id(table))
        if found is None or not found.settled[code]:
            out[name] = to_project(name, table.part(code, project_column), table.label, table.split, table.rows,
                                   target, time_column, project_column, fill)
            continue
        start, stop = table.bounds[code], table.bounds[code + 1]  # sorted by project first: the same bounds
        time = None if found.time is None else found.time[start:stop].copy()
        out[name] = finish(name, found.values[start:stop].copy(), found.names, time, found.positions[start:stop],
                           table.label, project_where(name, table.label, table.split), table.rows, fill)
    return out


def _cells(table: Table, target: str, time_column: str | None, project_column: str) -> _Cells | None:
    """The table's cells sorted and checked at once; None where its projects must be read one by one."""
    import pandas as pd

    frame, codes = table.frame, table.codes
    columns = [c for c in frame.columns if c != project_column]
    if not frame.columns.is_unique or target not in columns or not numeric_target(frame[target]):
        return None  # to_project names the problem (a duplicated column name: pandas already renamed it in a CSV)
    time_name = find_time_column(columns, target) if time_column is None else time_column
    if time_name is not None and time_name not in columns:
        return None
    count = len(table.names)
    unsettled = np.zeros(count, dtype=bool)
    if time_name is None:
        stamps, order = None, table.grouped  # row order is time order
    else:
        parsed = _stamps(frame[time_name], table)
        if parsed is None:
            return None
        stamps, missing = parsed
        unsettled[codes[missing]] = True
        # Stable by time, then stable by project: each project's rows in the order its own stable sort gives.
        by_time = np.argsort(stamps, kind="stable")
        order = by_time[np.argsort(codes[by_time], kind="stable")]
        stamps = stamps[order]
        same = (stamps[1:] == stamps[:-1]) & (codes[order][1:] == codes[order][:-1])
        unsettled[codes[order][1:][same]] = True  # a time given twice
    others = [c for c in columns if c not in {target, time_name}]
    for column in others:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        # refuse_text_cells's rule, per project: text cells in a column mostly of numbers
        numbers = pd.to_numeric(values, errors="coerce").notna().to_numpy()
        text = values.notna().to_numpy() & ~numbers
        texts, counted = np.bincount(codes, text, count), np.bincount(codes, numbers, count)
        unsettled |= (texts > 0) & (counted >= texts)
    cov_names = covariates(frame, others)
    values = frame[[target, *cov_names]].to_numpy(dtype=np.float64, na_value=np.nan)[order]
    return _Cells(values=values, names=[target, *map(str, cov_names)], positions=frame.index.to_numpy()[order],
                  time=stamps, settled=~unsettled)


def _stamps(column: pd.Series, table: Table) -> tuple[np.ndarray, np.ndarray] | None:
    """The time column as series._sort_by_time reads it, for all projects at once, and the rows it would refuse
    (no time, or not a date); None where it must be read project by project."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column):
        if not isinstance(column.dtype, np.dtype):
            return None  # a nullable integer column: its missing values are not NaN
        return column.to_numpy(), column.isna().to_numpy()  # numeric steps sort as numbers
    try:
        if column.dtype != object:
            if not pd.api.types.is_datetime64_any_dtype(column):
                return None
            stamps = parse_dates(column, errors="coerce").to_numpy()
        else:
            stamps = _text_dates(column.to_numpy(), table)
    except (ValueError, TypeError, OverflowError, ImportError):
        return None
    if stamps is None:
        return None
    return stamps, np.isnat(stamps)


def _text_dates(cells: np.ndarray, table: Table) -> np.ndarray | None:
    """Text dates parsed as pd.to_datetime parses each project's column: in the format it guesses from the project's
    first date (so "01/02/2024" may be January in one project and February in another, as before), every cell in
    it; one call per format, not per project."""
    from pandas._libs.tslib import first_non_null  # what pd.to_datetime guesses from (private: ImportError reads projects one by one)
    from pandas.tseries.api import guess_datetime_format

    guesses: dict[str, str | None] = {}
    formats: dict[str | None, int] = {}
    per_project = np.empty(len(table.names), dtype=np.int64)
    for k in range(len(table.names)):
        rows = cells[table.grouped[table.bounds[k]:table.bounds[k + 1]]]
        first = first_non_null(rows)
        cell = rows[first] if first != -1 else None
        if type(cell) is str:  # noqa: E721 - pandas guesses from a str only, not a subclass
            if cell not in guesses:
                guesses[cell] = guess_datetime_format(cell, dayfirst=False)
            fmt = guesses[cell]
        else:
            fmt = None
        per_project[k] = formats.setdefault(fmt, len(formats))
    per_row = per_project[table.codes]
    stamps: np.ndarray | None = None
    for fmt, index in formats.items():
        rows = np.flatnonzero(per_row == index)
        parsed = parse_dates(cells[rows], format=fmt, errors="coerce").to_numpy()
        if stamps is None:
            stamps = np.full(len(cells), np.datetime64("NaT"), dtype=parsed.dtype)
        if parsed.dtype != stamps.dtype:
            return None
        stamps[rows] = parsed
    return stamps
