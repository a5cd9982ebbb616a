"""Results out: CSV, Parquet or JSON, to a file (written atomically) or stdout.

CSV cells are neutralised for spreadsheets (OWASP's CSV injection advice): a text cell that starts with
``= + - @``, a tab or a carriage return gets a leading single quote, so a project named ``=HYPERLINK(...)``
is shown, never run as a formula. Rows end in CRLF (RFC 4180). Parquet and JSON keep every value as it is."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from gpufill.errors import InputError, visible
from gpufill.files import write_atomically

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet may read as the start of a formula (OWASP: CSV injection)."""
CSV_LINE_END = "\r\n"
"""RFC 4180's: with it Python's csv writer quotes a cell holding a lone CR (with "\n" it would split the row)."""


def write_frame(frame: pd.DataFrame, fmt: str, out: Path | None) -> None:
    if fmt == "csv":
        frame = csv_safe(frame, terminal=out is None and sys.stdout.isatty())
    if fmt == "parquet" and out is None:
        raise InputError("parquet is binary and needs a file", where="command line", field="--out", fix="add --out results.parquet")
    if out is None:
        text = frame.to_csv(index=False, lineterminator=CSV_LINE_END) if fmt == "csv" else json_records(frame) + "\n"
        sys.stdout.write(text)
        return
    # Through a new temporary file beside `out` (a link at `out` is refused, a full disk is one line).
    if fmt == "csv":
        write_atomically(out, frame.to_csv(index=False, lineterminator=CSV_LINE_END), field="--out")
    elif fmt == "parquet":
        write_atomically(out, lambda handle: frame.to_parquet(handle, index=False), field="--out")
    else:
        write_atomically(out, json_records(frame), field="--out")


def json_records(frame: pd.DataFrame) -> str:
    """`frame` as a JSON list of records, every float as Python's shortest exact repr. (pandas' own to_json
    keeps at most 15 decimals, so a 5 ms duration would come back changed in its 10th significant digit.)
    NaN and infinities are null, as in pandas."""
    records = frame.to_dict(orient="records")
    for record in records:
        for key, value in record.items():
            if (isinstance(value, float) and not math.isfinite(value)) or value is pd.NA or value is pd.NaT:
                record[key] = None
    return json.dumps(records, default=str, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def csv_safe(frame: pd.DataFrame, *, terminal: bool = False) -> pd.DataFrame:
    """A copy of `frame` whose text cells a spreadsheet cannot run: one starting with a formula character gets a
    leading single quote. `terminal`: the CSV goes to a terminal, so control characters are shown as escapes too."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object or pd.api.types.is_string_dtype(frame[column].dtype):
            frame[column] = frame[column].map(lambda value: _cell(value, terminal))
    return frame


def _cell(value: object, terminal: bool) -> object:
    if not isinstance(value, str):
        return value
    if terminal:
        value = visible(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value
