"""Whether a store can be used at all: damage SQLite finds, a full disk; each as one line for the user."""

from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path

from gpufill.errors import InputError

__all__ = ["check_intact", "check_rows", "damaged", "is_damage", "out_of_space"]


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


_OBJECTS = ("params", "train")
"""JSON columns every reader parses, each a JSON object; few distinct values (36,000 trials share a few hundred)."""
_DOCUMENTS = {"metrics": "object", "timings": "object", "plan": "object", "history": "array", "events": "array"}
"""JSON columns of a finished trial (one value per trial) and the JSON type each holds."""


def check_rows(db: sqlite3.Connection, path: Path, *, documents: bool = False) -> None:
    """Every trial's params and train, and every base, parse as JSON objects (with `documents`: each trial's metrics,
    timings, plan, history and events too, and its stored forecasts have whole rows): a row edited by hand or damaged
    is one line naming it, not a traceback in whichever command reads it first. For the commands that parse them
    (run and results: one scan of 36,000 trials in ~35 ms; report: with `documents`, ~0.2 s); status and monitor
    parse none of them."""
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "trials" not in tables:
        return
    present = {row[1] for row in db.execute("PRAGMA table_info(trials)")}
    objects = [c for c in _OBJECTS if c in present]
    for values in db.execute(f"SELECT DISTINCT {', '.join(objects)} FROM trials"):
        for column, text in zip(objects, values, strict=True):
            if not _parses(text):
                trial_id = db.execute(f"SELECT trial_id FROM trials WHERE {column} = ? LIMIT 1", (text,)).fetchone()[0]
                raise unreadable(path, "trials", column, "trial_id", trial_id)
    for base_id, text in db.execute("SELECT base_id, base FROM bases") if "bases" in tables else ():
        if not _parses(text):
            raise unreadable(path, "bases", "base", "base_id", base_id)
    if not documents:
        return
    columns = [c for c in _DOCUMENTS if c in present]
    # json_valid refuses NaN, which Python writes (older stores' metrics): those few rows are parsed here to tell.
    suspect = " OR ".join(f"({c} IS NOT NULL AND {c} != '' AND CASE WHEN json_valid({c}) THEN json_type({c}) != '{_DOCUMENTS[c]}' ELSE 1 END)"
                          for c in columns)
    for trial_id, *values in db.execute(f"SELECT trial_id, {', '.join(columns)} FROM trials WHERE {suspect}") if columns else ():
        for column, text in zip(columns, values, strict=True):
            if text and not _parses(text, kind=_DOCUMENTS[column]):
                raise unreadable(path, "trials", column, "trial_id", trial_id)
    for table in ("forecasts", "val_forecasts"):
        if table not in tables:
            continue
        row = db.execute(f"SELECT trial_id FROM {table} WHERE horizon < 1 OR length(origins) % 4 != 0 OR length(forecast) != length(truth)"
                         " OR length(forecast) != 4 * horizon * (length(origins) / 4) LIMIT 1").fetchone()
        if row is not None:
            raise unreadable(path, table, "forecast", "trial_id", row[0])


def _parses(text: object, *, kind: str = "object") -> bool:
    try:
        value = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return isinstance(value, dict if kind == "object" else list)


def unreadable(path: Path, table: str, column: str, key: str, value: str) -> InputError:
    """The one line for a row gpufill cannot read (the rest of the store is fine, and left as it is)."""
    return InputError(f"the {column} of {key} {value} holds data gpufill cannot read (the store was edited or damaged); nothing was changed",
                      where=str(path), field=f"{table}.{column}",
                      fix=f"restore {path.name} from a backup, or delete that row (sqlite3 {path} \"DELETE FROM {table} WHERE {key} = '{value}'\") "
                          "and run the campaign again: it computes it anew")
