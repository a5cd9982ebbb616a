"""MLflow URIs: every local part absolute against the working directory, and what MLflow could not use, or would write
where it must not, refused in one line (gpufill/mlflow_uri.py)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from gpufill.mlflow_uri import resolve_tracking_uri
from gpufill.errors import InputError


@pytest.fixture
def here(tmp_path, monkeypatch):
    (tmp_path / "REL").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    return tmp_path


@pytest.mark.parametrize(("uri", "expected"), [
    ("sqlite:///REL/mlflow.db", "sqlite:///{here}/REL/mlflow.db"),
    ("sqlite:///./REL/../REL/m.db", "sqlite:///{here}/REL/m.db"),
    ("sqlite:///{here}/REL/m.db", "sqlite:///{here}/REL/m.db"),  # absolute already: four slashes
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("https://mlflow.example.org", "https://mlflow.example.org"),
    ("postgresql+psycopg2://user@db/mlflow", "postgresql+psycopg2://user@db/mlflow"),
])
def test_a_usable_uri_is_kept_with_its_local_path_absolute(here, uri, expected):
    assert resolve_tracking_uri(uri.format(here=here), field="--uri") == expected.format(here=here)


@pytest.mark.parametrize(("uri", "words"), [
    ("gopher://x", "MLflow has no tracking store for the scheme 'gopher'"),
    ("http:///x", "a server URI needs a host"),
    ("sqlite://m.db", "names its file after three slashes"),
    ("sqlite:///:memory:", "names its file after three slashes"),
    ("sqlite:///NOPE/m.db", "the folder {here}/NOPE does not exist"),
    ("sqlite:///REL", "{here}/REL is a folder"),
    ("file:///{here}/data.txt", "{here}/data.txt is a file, and a file store is a folder"),
    ("file:REL/runs", "MLflow 3 refuses new file stores"),
    ("./mlruns", "MLflow 3 refuses new file stores"),
    ("file://otherhost/x", "names a path on this machine, not a host"),
    ("a b", "one word"),
])
def test_what_mlflow_could_not_use_is_one_line_naming_the_field(here, uri, words):
    (here / "data.txt").write_text("not a store")
    with pytest.raises(InputError) as refused:
        resolve_tracking_uri(uri.format(here=here), field="--uri")
    line = refused.value.one_line()
    assert line.startswith("--uri: ") and words.format(here=here) in line and "\n" not in line and "fix: " in line


def test_a_gpufill_store_is_never_mlflows_to_write(here):
    store = here / "work" / "gpufill.db"
    store.parent.mkdir()
    with pytest.raises(InputError, match="is a gpufill store"):
        resolve_tracking_uri(f"sqlite:///{store}", field="--uri", stores=[store])  # the run's own, before it exists
    with closing(sqlite3.connect(here / "other.db")) as db:
        db.executescript("CREATE TABLE meta (k); CREATE TABLE runs (r); CREATE TABLE trials (t);")
    with pytest.raises(InputError, match="other.db is a gpufill store: MLflow would add its own tables"):
        resolve_tracking_uri("sqlite:///other.db", field="--uri")  # any workdir's, found by its tables
    assert resolve_tracking_uri("sqlite:///REL/mlflow.db", field="--uri", stores=[store]) == f"sqlite:///{here}/REL/mlflow.db"


def test_a_file_store_works_where_the_user_opted_in(here, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert resolve_tracking_uri("file:REL/runs", field="loggers") == (here / "REL" / "runs").as_uri()
