"""Results out: CSV, Parquet or JSON, to a file (written atomically) or stdout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from gpufill.errors import InputError


def write_frame(frame: pd.DataFrame, fmt: str, out: Path | None) -> None:
    if fmt == "parquet" and out is None:
        raise InputError("parquet is binary and needs a file", where="command line", field="--out", fix="add --out results.parquet")
    if out is None:
        text = frame.to_csv(index=False) if fmt == "csv" else frame.to_json(orient="records", indent=None) + "\n"
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if fmt == "csv":
        frame.to_csv(tmp, index=False)
    elif fmt == "parquet":
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_json(tmp, orient="records")
    os.replace(tmp, out)
