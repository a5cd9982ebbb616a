"""Whether a store can be used at all: damage SQLite finds, a full disk; each as one line for the user."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from gpufill.errors import InputError

__all__ = ["check_intact", "damaged", "is_damage", "out_of_space"]


def damaged(path: Path, problem: object) -> InputError:
    """The one line for a store SQLite cannot read; nothing was written to it."""
    text = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
    return InputError(f"the campaign store is damaged or not a gpufill store ({text}); nothing was changed", where=str(path), field="store",
                      fix=f"restore {path.name} from a backup, or start over with `gpufill run FILE --workdir {path.parent} --fresh` (deletes it)")


def out_of_space(error: BaseException) -> bool:
    """A write refused because the disk (or the user's quota) is full: SQLite's SQLITE_FULL or the OS's ENOSPC/EDQUOT."""
    if isinstance(error, sqlite3.OperationalError):
        return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(error)
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def is_damage(error: BaseException) -> bool:
    """SQLite found the file is not a database or its pages are corrupt (not: busy, locked, full)."""
    return isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError)


def check_intact(db: sqlite3.Connection, path: Path, *, existing: bool) -> None:
    """SQLite's quick_check (structure of every page, linear in the file) and gpufill's tables, before any use."""
    verdict = db.execute("PRAGMA quick_check").fetchone()[0]
    if verdict != "ok":
        raise damaged(path, verdict)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if existing and "trials" not in tables:
        raise damaged(path, "it holds no trials table")
