"""One run per workdir: a second run or a --fresh on a live workdir is refused in one line naming the holder;
a lock left by a killed scheduler is taken over."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from gpufill.campaign.store.lock import LOCK_NAME, WorkdirLock, check_free, holder
from gpufill.campaign.run.runner import read_results
from gpufill.errors import InputError
from tests.helpers import write_campaign


def test_a_held_workdir_refuses_a_second_holder_naming_pid_and_host(tmp_path):
    with WorkdirLock(tmp_path, "gpufill run a.yaml"):
        with pytest.raises(InputError) as caught:
            WorkdirLock(tmp_path).acquire()
        text = str(caught.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}, gpufill run a.yaml since" in text and text.count("\n") == 0
        assert holder(tmp_path)["pid"] == os.getpid()
        with pytest.raises(InputError, match="another gpufill run is using this workdir"):
            check_free(tmp_path)
    assert holder(tmp_path) is None
    check_free(tmp_path)  # released: free again
    with WorkdirLock(tmp_path) as again:
        assert again.taken_over is None  # a clean release leaves no record to take over


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    stale = {"pid": 999999, "host": "elsewhere", "command": "gpufill run", "since": "2026-01-01T00:00:00"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))  # written, but nobody holds the flock: its process is gone
    assert holder(tmp_path) is None
    with WorkdirLock(tmp_path) as lock:
        assert lock.taken_over == stale
        assert holder(tmp_path)["pid"] == os.getpid()


@pytest.mark.slow
def test_a_second_run_and_a_fresh_exit_2_while_the_first_finishes_untouched(tmp_path):
    gate = tmp_path / "gate"
    path = write_campaign(tmp_path, projects=2, models=f"tests.campaign_models:gated: {{gate: '{gate}'}}\n  linear: {{}}")
    workdir = tmp_path / "work"
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(workdir)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    db = workdir / "gpufill.db"
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and done < 1:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    done = con.execute("SELECT count(*) FROM trials WHERE status = 'done'").fetchone()[0]
            except sqlite3.OperationalError:
                pass
        time.sleep(0.1)
    assert done >= 1 and first.poll() is None, "the first run must be live when the second starts"
    for extra in ([], ["--fresh", "--yes"]):
        second = subprocess.run(command + extra, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"another gpufill run is using this workdir (pid {first.pid} on" in lines[0], lines
    assert first.poll() is None, "the refused runs must not have stopped the first"
    gate.write_text("open")  # let the first run's gated trials finish
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    results = read_results(workdir)
    assert len(results) == 2 * 2 and (results["status"] == "done").all() and (results["attempts"] == 1).all()
    assert holder(workdir) is None
