"""Hung trials and crashes inside a task: a worker that stops answering or a trial past its time limit is
stopped, recorded (event and alert) and retried; a crash fails only the trial that was training, and the
task's trials that had not begun go back to the queue without using a retry."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import psutil
import pytest

from gpufill.campaign.run.scheduler import AUTO_TIMEOUT_FACTOR, AUTO_TIMEOUT_FLOOR_S, Scheduler
from tests.helpers import run_cli, write_campaign


def store_rows(workdir, query):
    with closing(sqlite3.connect(workdir / "gpufill.db")) as con:
        return con.execute(query).fetchall()


def campaign_with(tmp_path, model: str, resources: str, projects: int = 1):
    path = write_campaign(tmp_path, models=model, projects=projects, retries=1)
    path.write_text(path.read_text().replace("resources: {retries: 1}", f"resources: {{retries: 1, {resources}}}"))
    return path


@pytest.mark.slow
def test_a_stopped_worker_is_caught_by_its_silence_and_its_trial_retried(tmp_path, capsys):
    marker = tmp_path / "stalled"
    path = campaign_with(tmp_path, f"tests.campaign_models:stalls_on_first_try: {{marker: '{marker}', how: stop}}", "heartbeat_timeout: 6")
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 0, err
    assert "a worker silent for 6 s is stopped" in " ".join(out.split())  # the plan says so (rich wraps lines)
    assert store_rows(tmp_path / "work", "SELECT status, attempts FROM trials") == [("done", 2)]
    alerts = store_rows(tmp_path / "work", "SELECT message FROM events WHERE kind = 'alert_hung'")
    assert len(alerts) == 1 and "worker stopped answering: no heartbeat for" in alerts[0][0]
    failed = store_rows(tmp_path / "work", "SELECT message FROM events WHERE kind = 'trial_failed'")
    assert len(failed) == 1 and "attempt 1/2: worker stopped answering" in failed[0][0]
    assert not psutil.pid_exists(int(marker.read_text())) or psutil.Process(int(marker.read_text())).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_trial_past_its_time_limit_is_stopped_and_retried(tmp_path, capsys):
    marker = tmp_path / "slow"
    path = campaign_with(tmp_path, f"tests.campaign_models:stalls_on_first_try: {{marker: '{marker}', how: sleep}}", "trial_timeout: 8")
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 0, err
    assert "trial timeout: 8 s per trial" in " ".join(out.split())
    assert store_rows(tmp_path / "work", "SELECT status, attempts FROM trials") == [("done", 2)]
    (alert,), = store_rows(tmp_path / "work", "SELECT message FROM events WHERE kind = 'alert_hung'")
    assert "timed out after" in alert and "limit 8 s; resources.trial_timeout 8 s per trial" in alert


@pytest.mark.slow
def test_a_crash_fails_only_the_trial_that_was_training(tmp_path, capsys):
    """4 trials of one new shape go to one worker as a probe task; the first crashes its worker (a segfault):
    it alone uses an attempt; the other 3 go back to the queue unattempted and each runs once. (A worker killed
    from outside, kill -9 style, uses no attempt at all: test_integrity.py.)"""
    marker = tmp_path / "crashed"
    path = write_campaign(tmp_path, models=f"tests.integrity_models:crashes_on_first_try: {{marker: '{marker}', how: segv}}", projects=4, retries=1)
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 0, err
    attempts = sorted(a for (a,) in store_rows(tmp_path / "work", "SELECT attempts FROM trials WHERE status = 'done'"))
    assert attempts == [1, 1, 1, 2]
    crashes = store_rows(tmp_path / "work", "SELECT message FROM events WHERE kind = 'worker_crashed'")
    assert len(crashes) == 1 and "SIGSEGV" in crashes[0][0]
    assert len(store_rows(tmp_path / "work", "SELECT 1 FROM events WHERE kind = 'trial_failed'")) == 1


def test_the_auto_limit_follows_the_slowest_finished_trial_of_the_shape():
    scheduler = Scheduler.__new__(Scheduler)  # only the limit arithmetic
    scheduler.trial_timeout, scheduler.shape_seconds = "auto", {"a": 2.0, "b": 30.0}
    assert scheduler._limit("new", 1)[0] is None
    assert scheduler._limit("a", 1)[0] == AUTO_TIMEOUT_FLOOR_S  # 10 x 2 s is under the floor
    assert scheduler._limit("b", 4)[0] == 4 * AUTO_TIMEOUT_FACTOR * 30.0  # a pack of 4 training together
    scheduler.trial_timeout = 5.0
    assert scheduler._limit("new", 2) == (10.0, "resources.trial_timeout 5 s per trial")
