"""One project's table (rows of one series, as sources.py read them) to a Project: ordered by its time column,
the target and numeric covariates as float arrays, missing values filled as the campaign says, every value
checked (text cells, duplicate times, non-finite or huge values), each problem named with its file and row."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpufill.errors import InputError
from gpufill.forecasting.data.checks import Rows, check_values, refuse_duplicate_times, refuse_text_cells
from gpufill.forecasting.data.project import Project, cells_fingerprint, season_length_of

if TYPE_CHECKING:
    import pandas as pd

FILLS = ("none", "ffill", "interpolate", "zero")
TIME_NAMES = ("time", "date", "timestamp")
"""Time columns found without being named (case-insensitive)."""


def to_project(
    name: str,
    frame: pd.DataFrame,
    label: str,
    split: bool,
    rows: Rows,
    target: str,
    time_column: str | None,
    project_column: str,
    fill: str,
) -> Project:
    import pandas as pd

    where = project_where(name, label, split)
    columns = [str(c) for c in frame.columns]
    if target not in frame.columns:
        raise InputError(f"no target column {target!r}; columns present: {', '.join(columns)}",
                         fix="pass target=<one of those columns>", where=where, field="target")
    frame, time, time_name = _sort_by_time(frame, where, time_column, target, rows)
    column = frame[target]
    if not numeric_target(column):
        bad = column[pd.to_numeric(column, errors="coerce").isna() & column.notna()]
        example = f", e.g. {bad.iloc[0]!r} at {rows.name(int(bad.index[0]))}" if len(bad) else ""
        raise InputError(f"target column is not numeric (dtype {column.dtype}{example})",
                         fix="point target= at a numeric column, or clean the non-numeric values", where=where, field=target)
    others = [c for c in frame.columns if c not in {target, time_name, project_column}]
    refuse_text_cells(frame, others, where, rows)
    cov_names = covariates(frame, others)
    values = frame[[target, *cov_names]].to_numpy(dtype=np.float64, na_value=np.nan)
    return finish(name, values, [target, *map(str, cov_names)], time, frame.index.to_numpy(), label, where, rows, fill)


def finish(
    name: str, values: np.ndarray, names: list[str], time: np.ndarray | None, positions: np.ndarray, label: str, where: str, rows: Rows, fill: str
) -> Project:
    """A project's cells in time order (target first, then covariates) to a Project: fingerprinted, filled and
    checked, in that order, however they were gathered (one frame here, a whole table in tables.py)."""
    # The cells as read, before the fill (which the campaign's data settings name): a pure function of the
    # file's bytes, so the same fingerprint on every machine; nothing a kernel computed enters it.
    origin = cells_fingerprint(values[:, 0], values[:, 1:], names[1:])
    values = _fill(values, names, fill, where)
    check_values(values, names, where, positions, rows)
    return Project(
        name=name,
        target=np.ascontiguousarray(values[:, 0]),
        covariates=np.ascontiguousarray(values[:, 1:]),
        covariate_names=tuple(names[1:]),
        source=label,
        time=time,
        origin=origin,
        season=season_length_of(time, label),  # pandas is loaded here; a worker handed the project is spared it
    )


def project_where(name: str, label: str, split: bool) -> str:
    """What a refusal names: the file(s), and the project when the file holds several."""
    return f"{label} (project {name})" if split else label


def numeric_target(column: pd.Series) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def covariates(frame: pd.DataFrame, others: list[object]) -> list[object]:
    """Covariates: every numeric column but the target, time and project columns, in file order; text columns are
    ignored (a numeric one with text cells is refused before, by refuse_text_cells)."""
    import pandas as pd

    return [c for c in others if pd.api.types.is_numeric_dtype(frame[c])]


def find_time_column(columns: list[object], target: str) -> object | None:
    """The time column found without being named: the first called time/date/timestamp (any case), not the target."""
    return next((c for c in columns if str(c).lower() in TIME_NAMES and c != target), None)


def _sort_by_time(
    frame: pd.DataFrame, where: str, time_column: str | None, target: str, rows: Rows
) -> tuple[pd.DataFrame, np.ndarray | None, object]:
    """Sort rows by the time column; a time given twice is refused (which row would be the series' value?)."""
    import pandas as pd

    name = time_column
    if name is None:
        name = find_time_column(list(frame.columns), target)
        if name is None:
            return frame, None, None  # row order is time order
    elif name not in frame.columns:
        raise InputError(f"no time column {name!r}; columns present: {', '.join(map(str, frame.columns))}",
                         fix="pass time_column=<one of those columns>, or time_column=None to use row order", where=where, field="time_column")
    column = frame[name]
    if pd.api.types.is_numeric_dtype(column):
        stamps = column  # numeric steps sort as numbers
    else:
        try:
            stamps = parse_dates(column)
        except (ValueError, TypeError) as exc:
            raise InputError(f"cannot parse time values as dates ({' '.join(str(exc).split())[:120]})",
                             fix=f"write {name!r} in one date format (e.g. 2024-01-31), or set time_column to another column", where=where, field=str(name)) from exc
    if stamps.isna().any():
        raise InputError(f"{int(stamps.isna().sum())} rows have no time value",
                         fix=f"fill in {name!r} on every row, or drop those rows", where=where, field=str(name))
    refuse_duplicate_times(stamps.to_numpy(), column.to_numpy(), frame.index.to_numpy(), str(name), where, rows)
    order = np.argsort(stamps.to_numpy(), kind="stable")
    return frame.iloc[order], stamps.to_numpy()[order], name


def parse_dates(values: pd.Series | np.ndarray, **how: object) -> pd.Series | pd.DatetimeIndex:
    """Time cells that are not numbers, as naive stamps: utc=True accepts mixed offsets; naive stamps are read as
    UTC, so nothing shifts. `how`: more pd.to_datetime arguments (a format, errors)."""
    import pandas as pd

    parsed = pd.to_datetime(values, utc=True, **how)
    return parsed.dt.tz_localize(None) if isinstance(parsed, pd.Series) else parsed.tz_localize(None)


def _fill(values: np.ndarray, names: list[str], fill: str, where: str) -> np.ndarray:
    """Apply the fill policy column-wise (vectorised via pandas); leave no NaN behind."""
    import pandas as pd

    nan_counts = np.isnan(values).sum(axis=0)
    if nan_counts.any() and fill == "none":
        counts = [(names[i], int(nan_counts[i])) for i in np.flatnonzero(nan_counts)]
        listed = ", ".join(f"{n} in {c!r}" for c, n in counts)
        raise InputError(f"missing values (NaN): {listed}",
                         fix="clean the data, or set fill to ffill, interpolate or zero", where=where, field=counts[0][0])
    if nan_counts.any():
        table = pd.DataFrame(values)
        if fill == "ffill":
            table = table.ffill().bfill()  # back-fill only the leading NaNs that ffill cannot reach
        elif fill == "interpolate":
            table = table.interpolate(method="linear", limit_direction="both")
        else:
            table = table.fillna(0.0)
        values = table.to_numpy(dtype=np.float64)
        empty = [names[i] for i in np.flatnonzero(np.isnan(values).all(axis=0))]
        if empty:
            raise InputError(f"column {empty[0]!r} has no values at all, so fill={fill!r} has nothing to fill from",
                             fix="remove the column from the file, or fill it in", where=where, field=empty[0])
    return values
