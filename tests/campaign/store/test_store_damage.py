"""Every damage is one line: a damaged store, a deleted WAL, a full disk, a workdir that is a file, markup in
names, NaN metrics, values that overflow. Exit 2 and one line naming the file, the field and the fix; never a
traceback; nothing already finished is lost."""

from __future__ import annotations

import io
import shutil
from contextlib import closing
import sqlite3
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from gpufill.campaign.worker.attempt import attempt
from gpufill.campaign.store.store import Store
from tests.helpers import a_result, a_trial, run_cli, run_cli_captured, write_campaign

DB = "gpufill.db"
READERS = (["status"], ["results"], ["results", "--summary"], ["report"], ["monitor", "--once"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A campaign run to the end once (4 trials); each test works on its own copy."""
    base = tmp_path_factory.mktemp("finished")
    path = write_campaign(base, models="linear: {alpha: [0.0, 1.0]}", projects=2)
    code, _out, err = run_cli_captured("run", path, "--workdir", base / "work", "--executor", "inline")
    assert code == 0, err
    return path, base / "work"


def copy_of(finished, tmp_path):
    path, work = finished
    target = tmp_path / "work"
    shutil.copytree(work, target)
    return path, target


def trials_of(workdir) -> pd.DataFrame:
    with closing(sqlite3.connect(workdir / DB)) as con:  # closed: an open connection would keep a deleted WAL alive
        return pd.read_sql("SELECT trial_id, project, params, status, attempts, mae FROM trials ORDER BY trial_id", con)


def assert_one_line(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpufill: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def garbage(db):
    db.write_bytes(b"this is not a database at all\n" * 200)


def truncated(db):
    with open(db, "r+b") as handle:
        handle.truncate(db.stat().st_size // 2)


@pytest.mark.parametrize("damage", [garbage, truncated])
def test_a_damaged_store_is_one_line_for_every_command_and_stays_as_it_was(finished, tmp_path, capsys, damage):
    path, work = copy_of(finished, tmp_path)
    damage(work / DB)
    before = (work / DB).read_bytes()
    for command in [*READERS, ["run", path]]:
        code, _out, err = run_cli(capsys, *command, "--workdir", work)
        assert code == 2, (command, err)
        assert_one_line(err, str(work / DB), "store:", "damaged", "--fresh")
    assert (work / DB).read_bytes() == before  # nothing was written to it


def test_an_empty_store_file_is_refused_until_fresh_starts_it_over(finished, tmp_path, capsys):
    """A zero-byte gpufill.db (e.g. cut by a full disk) is not silently taken for a new campaign."""
    path, work = copy_of(finished, tmp_path)
    (work / DB).write_bytes(b"")
    for command in (["results"], ["run", path]):
        code, _out, err = run_cli(capsys, *command, "--workdir", work)
        assert code == 2
        assert_one_line(err, "holds no trials table", "--fresh")
    code, _out, err = run_cli(capsys, "run", path, "--workdir", work, "--fresh", "--yes", "--executor", "inline")
    assert code == 0, err
    assert (trials_of(work)["status"] == "done").sum() == 4


def test_a_deleted_wal_loses_only_what_it_held_and_the_run_finishes(finished, tmp_path, capsys):
    """A scheduler killed with writes in its WAL, then the WAL deleted: the store is its last checkpoint."""
    path, work = copy_of(finished, tmp_path)
    before = trials_of(work)
    lose_one = (f"import os, sqlite3\ncon = sqlite3.connect({str(work / DB)!r}, isolation_level=None)\ncon.execute('PRAGMA journal_mode=WAL')\n"
                f"con.execute(\"UPDATE trials SET mae = -1 WHERE trial_id = '{before.trial_id[0]}'\")\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", lose_one], check=True)
    assert (work / f"{DB}-wal").stat().st_size > 0
    (work / f"{DB}-wal").unlink()
    code, out, err = run_cli(capsys, "results", "--workdir", work, "--format", "csv")
    assert code == 0, err
    shown = pd.read_csv(io.StringIO(out)).set_index("trial_id")["mae"]
    assert shown.to_dict() == before.set_index("trial_id")["mae"].to_dict()  # the write that lived only in the WAL is gone
    code, _out, err = run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")
    assert code == 0, err
    pd.testing.assert_frame_equal(trials_of(work), before)  # nothing re-run, nothing changed


def test_a_workdir_that_is_a_file_is_one_line(finished, tmp_path, capsys):
    path, _work = finished
    not_a_dir = tmp_path / "notes.txt"
    not_a_dir.write_text("mine\n")
    for command in [["run", path], ["status"], ["results"]]:
        code, _out, err = run_cli(capsys, *command, "--workdir", not_a_dir)
        assert code == 2, (command, err)
        assert_one_line(err, "--workdir")
    assert not_a_dir.read_text() == "mine\n"
    code, _out, err = run_cli(capsys, "run", path, "--workdir", not_a_dir / "inside")
    assert code == 2
    assert_one_line(err, "is a file, not a directory")


def test_a_full_disk_stops_the_run_in_one_line_and_a_resume_keeps_what_was_done(tmp_path, capsys, monkeypatch):
    """SQLite's page limit stands in for a full disk: the same SQLITE_FULL error a full disk raises."""
    path = write_campaign(tmp_path, models="mlp: {hidden_size: [8, 16]}", projects=2)  # 4 trials with a history each
    work = tmp_path / "full"
    original = Store.record_done

    def then_fill_the_disk(self, *args, **kwargs):
        # The disk fills once the first trial is stored (whatever else the run wrote before it on a busy
        # machine: monitor samples, events): the next write that needs a page fails.
        out = original(self, *args, **kwargs)
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        self.db.execute(f"PRAGMA max_page_count = {pages}")
        return out

    monkeypatch.setattr(Store, "record_done", then_fill_the_disk)
    code, _out, err = run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")
    assert code == 2
    assert_one_line(err, "disk holding the workdir is full", f"resume with: gpufill run {path} --workdir {work}")
    kept = trials_of(work)
    done_before = kept[kept.status == "done"]
    assert 1 <= len(done_before) < 4 and set(kept.status) <= {"done", "pending"}  # the one in flight is back to pending
    monkeypatch.setattr(Store, "record_done", original)  # space freed
    code, _out, err = run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")
    assert code == 0, err
    after = trials_of(work).set_index("trial_id")
    assert (after.status == "done").all() and len(after) == 4
    for row in done_before.itertuples():  # what finished before the disk filled is kept as it was
        assert (after.loc[row.trial_id, "attempts"], after.loc[row.trial_id, "mae"]) == (row.attempts, row.mae)


def test_nan_metrics_in_a_store_are_left_out_of_the_summary_and_report(finished, tmp_path, capsys):
    """Older stores can hold NaN metrics (SQLite keeps them as NULL): shown empty, never ranked."""
    _path, work = copy_of(finished, tmp_path)
    trials = trials_of(work)
    nan_trial = trials.iloc[0]
    with closing(sqlite3.connect(work / DB)) as con, con:
        con.execute("UPDATE trials SET mae = NULL, rmse = NULL, smape = NULL, mase = NULL WHERE trial_id = ?", (nan_trial.trial_id,))
    code, out, err = run_cli(capsys, "results", "--workdir", work, "--summary", "--format", "csv")
    assert code == 0, err
    summary = pd.read_csv(io.StringIO(out)).set_index("project")
    assert len(summary) == 2 and summary["mae"].notna().all()
    other = trials[(trials.project == nan_trial.project) & (trials.trial_id != nan_trial.trial_id)].iloc[0]
    assert summary.loc[nan_trial.project, "mae"] == pytest.approx(other.mae)  # its project's other configuration, alone
    assert summary.loc[nan_trial.project, "params"] == other.params
    for command in (["results"], ["report"]):
        code, _out, err = run_cli(capsys, *command, "--workdir", work)
        assert code == 0, err
    assert (work / "report.html").stat().st_size > 1000


def test_rich_markup_in_names_is_printed_as_text():
    from gpufill.cli import campaign_tables as render
    from gpufill.cli import live

    frame = pd.DataFrame({"trial_id": ["abcdef123456"], "project": ["[/x]"], "family": ["[bold]mlp"], "params": ["{}"], "seed": [0],
                          "lookback": [12], "status": ["done"], "attempts": [1], "lane": ["cpu"], "duration_s": [1.0],
                          "mae": [0.5], "rmse": [0.6], "smape": [10.0], "mase": [0.9]})
    console = Console(record=True, width=200)
    console.print(render.results_table(frame, summary=False))
    running = {"family": "[bold]mlp", "project": "[/x]", "worker": "[red]w", "seconds": 3.0}
    counts = {"done": 0, "total": 1, "failed": 0, "lanes": {"cpu": dict.fromkeys(("total", "done", "failed", "running", "pending", "skipped"), 0)}}
    console.print(live.render({"campaign": "[/c]", "counts": counts, "eta_s": None, "trials_per_min": 0.0, "series": {}, "running": [running],
                               "alerts": ["[/y] stalled"]}))
    text = console.export_text()
    assert "[/x]" in text and "[bold]mlp" in text and "[red]w" in text and "[/c]" in text and "[/y] stalled" in text


def test_values_that_would_overflow_are_refused_at_load(tmp_path, capsys):
    t = np.arange(300)
    pd.DataFrame({"t": t, "y": 1e307 * np.sin(t / 5)}).to_csv(tmp_path / "huge.csv", index=False)
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\ndata: {source: huge.csv, target: y}\ntask: {lookback: [12], horizon: 1}\nmodels:\n  linear: {}\nseeds: [0]\n")
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2
    assert_one_line(err, "huge.csv", "'y'", "overflow", "divide the column by a power of ten")
    assert not (tmp_path / "work").exists()


def test_a_trial_whose_metrics_are_not_finite_fails_with_its_reason():
    """Every way of running trials reports through attempt(): NaN or infinite test metrics make a failure."""
    trial = a_trial()
    scored = a_result({"mae": 0.5, "rmse": float("inf"), "smape": float("nan"), "mase": 1.0}, {})
    outcome = attempt(trial, lambda: scored)
    assert outcome.ok is False
    assert outcome.error == ("NonFiniteMetrics: test metrics are not finite (rmse=inf, smape=nan): the predictions overflowed or the "
                                "training diverged; lower the learning rate, or check the data's scale")
    fine = a_result({"mae": 0.5, "rmse": 0.6, "smape": 10.0, "mase": 1.0}, {})
    assert attempt(trial, lambda: fine).ok is True
    diverged = a_result({"mae": 0.5, "rmse": 0.6, "smape": 10.0, "mase": 1.0}, {}, status="diverged")
    assert attempt(trial, lambda: diverged).error == "FloatingPointError: training diverged: non-finite loss"  # a diverged fit never ranks
