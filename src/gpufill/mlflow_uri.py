"""MLflow tracking URIs as gpufill takes them: checked, and every local part made absolute against the working directory.

MLflow reads `sqlite:///REL/mlflow.db` against the working directory for the database, but a new experiment's
artifacts are placed by gpufill beside that store (engine/loggers.py `mlflow_experiment`): a relative URI must name
the same place for both, so it is made absolute once, here, for `tracking:`, `gpufill run --mlflow`, `gpufill export
mlflow --uri` and `fit(loggers=["mlflow:..."])` alike. Refused in one line: a scheme MLflow does not read, a server
URI without a host, a database inside a gpufill store (MLflow would add its tables to it), a folder that does not
exist, and `file:` stores, which MLflow 3 refuses unless its opt-in is set (`MLFLOW_ALLOW_FILE_STORE=true`): the fix
names `sqlite:`. Standard library only: the scheduler imports this.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

from gpufill.errors import InputError

__all__ = ["SCHEMES", "client_defaults", "resolve_tracking_uri"]

SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "file")
"""What MLflow's tracking stores read (a database scheme may name its driver: postgresql+psycopg2)."""
GPUFILL_TABLES = {"trials", "meta", "runs"}
"""Tables of a gpufill store (campaign/store/store.py): a database holding them is not MLflow's to write."""


def resolve_tracking_uri(uri: str, *, field: str, base: Path | None = None, stores: Sequence[Path] = ()) -> str:
    """`uri` with its local path absolute (relative to `base`, default the working directory); InputError naming
    `field` where MLflow could not use it or would write where it must not (`stores`: gpufill stores it may not name)."""
    base = base or Path.cwd()
    if not uri or not uri.isprintable() or any(c.isspace() for c in uri):
        raise _refused(uri, field, "an MLflow tracking URI is one word", "e.g. http://127.0.0.1:5000 or sqlite:///path/mlflow.db")
    scheme, colon, rest = uri.partition(":")
    if not colon or "/" in scheme or len(scheme) < 2:  # a bare path (or C:\...): MLflow's file store
        scheme, rest = "file", uri
    kind = scheme.lower().split("+", 1)[0]
    if kind not in SCHEMES:
        raise _refused(uri, field, f"MLflow has no tracking store for the scheme {scheme!r}",
                       "use http(s)://HOST:PORT (a server), sqlite:///PATH/mlflow.db (a local file) or a database URL (postgresql://...)")
    if kind in ("http", "https") and not urlsplit(uri).hostname:
        raise _refused(uri, field, "a server URI needs a host", f"write {kind}://HOST:PORT, e.g. {kind}://127.0.0.1:5000")
    if kind == "sqlite":
        return "sqlite:///" + str(_sqlite_path(uri, rest, field, base, stores))
    if kind == "file":
        return _file_store(uri, rest, field, base).as_uri()
    return uri


def _sqlite_path(uri: str, rest: str, field: str, base: Path, stores: Sequence[Path]) -> Path:
    if not rest.startswith("///") or rest in ("///", "///:memory:"):
        raise _refused(uri, field, "a SQLite tracking URI names its file after three slashes (four for an absolute path)",
                       "write sqlite:///mlflow.db (here) or sqlite:////abs/path/mlflow.db")
    path = Path(os.path.abspath(base / rest[3:]))  # abspath: '..' folded, no link followed
    if not path.parent.is_dir():
        raise _refused(uri, field, f"the folder {path.parent} does not exist", "create it, or name a file in an existing folder")
    if path.is_dir():
        raise _refused(uri, field, f"{path} is a folder", "name the database file inside it, e.g. sqlite:///" + str(path / "mlflow.db"))
    if any(path == Path(os.path.abspath(store)) for store in stores) or _is_gpufill_store(path):
        raise _refused(uri, field, f"{path} is a gpufill store: MLflow would add its own tables to it",
                       f"track to a file of its own, e.g. sqlite:///{path.parent / 'mlflow.db'}")
    return path


def _file_store(uri: str, rest: str, field: str, base: Path) -> Path:
    if rest.startswith("//") and not rest.startswith("///") and urlsplit("file:" + rest).hostname not in (None, "", "localhost"):
        raise _refused(uri, field, "a file: URI names a path on this machine, not a host", "write file:///abs/path or file:relative/path")
    local = rest[2:] if rest.startswith("//") else rest  # file://localhost/x and file:///x: the path after the host
    local = local[len("localhost"):] if local.startswith("localhost/") else local
    path = Path(os.path.abspath(base / local))
    if path.exists() and not path.is_dir():
        raise _refused(uri, field, f"{path} is a file, and a file store is a folder", "name a folder, or use sqlite:///" + str(path.with_suffix(".db")))
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise _refused(uri, field, "MLflow 3 refuses new file stores (maintenance mode)",
                       f"use a SQLite store, e.g. sqlite:///{path / 'mlflow.db'} (or set MLFLOW_ALLOW_FILE_STORE=true to keep the folder)")
    return path


def _is_gpufill_store(path: Path) -> bool:
    """Whether `path` is a SQLite file holding gpufill's tables (read-only, never created)."""
    if not path.is_file():
        return False
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return False
    return GPUFILL_TABLES <= names


def _refused(uri: str, field: str, problem: str, fix: str) -> InputError:
    return InputError(f"{problem} ({uri})", field=field, fix=fix)


@contextlib.contextmanager
def client_defaults(values: Mapping[str, str]) -> Iterator[None]:
    """`values` (MLflow's client settings: request timeout, retries) in the environment where the user set none, for
    the duration: MLflow reads them at each request."""
    added = [key for key in values if key not in os.environ]
    os.environ.update({key: values[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
