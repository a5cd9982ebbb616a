"""What a loaded table must satisfy before it becomes a Project, each refusal one line naming the file,
the column and the row: one time value per row, numbers in every numeric column, no NaN left after the
fill policy, and magnitudes that the stored float32 forecasts hold (neither overflowing to inf nor
vanishing to 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufill.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

MAX_ABS_VALUE = 1e38
"""Larger magnitudes are refused at load: a trial's forecasts and actual values are stored as float32, whose
largest finite value is 3.4e38 (past it they read back as inf: ensembles blank, JSON invalid)."""
MIN_SCALE = 1e-30
"""A column whose largest magnitude is below this (and not all zero) is refused at load: float32 keeps full
precision only down to 1.2e-38 (stored forecasts would read back as 0) and squares underflow (RMSE 0.0)."""


@dataclass(frozen=True, slots=True)
class Rows:
    """Names a row of a loaded table by where it sits in its file(s): what a refusal points the user at."""

    shards: tuple[tuple[Path, int], ...]
    """Each file the table was read from, in order, with its number of rows."""

    def name(self, position: int) -> str:
        """The row at `position` of the table as read (shards concatenated): "line 7" of a CSV (the header
        is line 1), "row 6" of a parquet file, with the shard's name when the table came from several."""
        for path, count in self.shards:
            if position < count:
                text = f"line {position + 2}" if path.suffix.lower() == ".csv" else f"row {position + 1}"
                return f"{text} of {path.name}" if len(self.shards) > 1 else text
            position -= count
        return f"row {position + 1}"


def refuse_duplicate_times(stamps: np.ndarray, written: np.ndarray, positions: np.ndarray, column: str, where: str, rows: Rows) -> None:
    """Two rows of one series at the same time: which one is the series' value there? Refused, naming both rows.
    `stamps`: the parsed times; `written`: the cells as the file has them (what the message shows)."""
    import pandas as pd

    repeated = pd.Series(stamps).duplicated(keep=False).to_numpy()
    if not repeated.any():
        return
    first = int(np.flatnonzero(repeated)[0])
    same = np.flatnonzero(repeated & (stamps == stamps[first]))
    shown = str(written[same[0]])
    extra = f" (and {len(same) - 2} more)" if len(same) > 2 else ""
    raise InputError(
        f"time {shown} appears {len(same)} times: {rows.name(int(positions[same[0]]))} and {rows.name(int(positions[same[1]]))}{extra}",
        fix="keep one row per time step (aggregate or drop the duplicates); if the file holds several series, set data.project_column "
            "to the column that tells them apart",
        where=where,
        field=column,
    )


def refuse_text_cells(frame: pd.DataFrame, columns: list[object], where: str, rows: Rows) -> None:
    """A column of numbers with a few text cells ("n.a.", "12kg") reads as text and would be dropped as a covariate
    silently: refused, naming the first such cell. A column mostly of text (a weekday, a store name) is not a
    covariate and is left out."""
    import pandas as pd

    for column in columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        numbers = pd.to_numeric(values, errors="coerce")
        text = (values.notna() & numbers.isna()).to_numpy()
        if not text.any() or int(numbers.notna().sum()) < int(text.sum()):
            continue
        at = int(np.flatnonzero(text)[0])
        raise InputError(
            f"column holds numbers but {values.iloc[at]!r} at {rows.name(int(frame.index[at]))} is text ({int(text.sum())} text cell(s)), "
            "so the whole column would be read as text and left out",
            fix="replace the text with a number, or empty the cell and set data.fill",
            where=where,
            field=str(column),
        )


def check_values(values: np.ndarray, names: list[str], where: str, positions: np.ndarray, rows: Rows) -> None:
    """Refuse infinite values and magnitudes float32 storage cannot hold (see MAX_ABS_VALUE, MIN_SCALE)."""
    infinite = np.isinf(values).sum(axis=0)
    if infinite.any():
        i = int(np.flatnonzero(infinite)[0])
        at = int(np.flatnonzero(np.isinf(values[:, i]))[0])
        raise InputError(f"{int(infinite[i])} infinite values in column {names[i]!r} (the first at {rows.name(int(positions[at]))})",
                         fix="replace the infinite values in the file with real numbers", where=where, field=names[i])
    if not len(values):
        return
    largest = np.abs(values).max(axis=0)
    if (largest > MAX_ABS_VALUE).any():
        i = int(np.flatnonzero(largest > MAX_ABS_VALUE)[0])
        at = int(np.argmax(np.abs(values[:, i])))
        raise InputError(
            f"values up to {largest[i]:.3g} in column {names[i]!r} (at {rows.name(int(positions[at]))}) would overflow the stored float32 forecasts "
            f"(at most {MAX_ABS_VALUE:.0e} is accepted)",
            fix=f"divide the column by a power of ten in the file (e.g. 1e{int(np.log10(largest[i])) - 3}); metrics are then in those units",
            where=where,
            field=names[i],
        )
    tiny = (largest > 0) & (largest < MIN_SCALE)
    if tiny.any():
        i = int(np.flatnonzero(tiny)[0])
        raise InputError(
            f"values in column {names[i]!r} are all smaller than {MIN_SCALE:.0e} in magnitude (the largest is {largest[i]:.3g}): "
            "float32 forecasts and squared errors lose them to 0",
            fix=f"multiply the column by a power of ten in the file (e.g. 1e{-int(np.floor(np.log10(largest[i])))}); metrics are then in those units",
            where=where,
            field=names[i],
        )
