"""Where in the user's script something happened: the innermost frame outside torch and gpufill,
as the user would write its file (relative to the working directory when inside it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent.parent)  # the gpufill package: its frames are not "the script's line"


def in_library(filename: str) -> bool:
    return filename.startswith(_HERE) or "/torch/" in filename or filename.startswith("<")


_SHORT: dict[str, str] = {}


def short_path(filename: str) -> str:
    """The file as the user would write it (relative to the working directory when inside it); cached."""
    if filename not in _SHORT:
        relative = os.path.relpath(filename)
        _SHORT[filename] = filename if relative.startswith("..") else relative
    return _SHORT[filename]


def script_line() -> str:
    """file:line of the innermost frame outside torch and gpufill: the user's line."""
    frame = sys._getframe(2)
    while frame is not None:
        if not in_library(frame.f_code.co_filename):
            return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"
