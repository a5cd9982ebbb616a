"""`module:factory` models are imported and built in a child process and the workers, never in the scheduler:
bad values are still one line at load time; a factory that crashes fails its own trials and the run goes on."""

from __future__ import annotations

import os
import sqlite3
import sys
from contextlib import closing

import pytest

from tests.helpers import run_cli, write_campaign


@pytest.mark.slow
def test_a_factory_that_crashes_on_import_fails_its_trials_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "imported-by"
    monkeypatch.setenv("GPUFILL_TEST_IMPORTED_BY", str(marker))
    path = write_campaign(tmp_path, models="tests.crashing_factory:make: {}\n  linear: {}", projects=1, retries=0)
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 1, err  # a failed trial, not bad input
    text = " ".join(out.split())
    assert "checking model tests.crashing_factory:make crashed (killed by SIGSEGV)" in text
    assert "done 1, failed 1, pending 0 of 2 trials" in text
    assert "tests.crashing_factory" not in sys.modules  # the scheduler (this process) never imported it
    assert int(marker.read_text()) != os.getpid()
    with closing(sqlite3.connect(tmp_path / "work" / "gpufill.db")) as con:
        rows = dict(con.execute("SELECT family, status || ': ' || COALESCE(error, '') FROM trials"))
    assert rows["linear"] == "done: "
    assert rows["tests.crashing_factory:make"].startswith("failed: worker process died with SIGSEGV")


def test_a_bad_grid_value_of_a_users_factory_is_still_one_line_at_load(tmp_path, capsys):
    path = write_campaign(tmp_path, models="tests.campaign_models:always_raises: {hidden: [1]}", projects=1)
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"gpufill: error: {path}:5: models.tests.campaign_models:always_raises.hidden: unknown parameter 'hidden'")
    assert not (tmp_path / "work").exists()
