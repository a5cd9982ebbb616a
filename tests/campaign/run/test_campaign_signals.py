"""SIGINT, SIGTERM and SIGHUP stop a run cleanly: workers gone, in-flight trials back to pending, the run marked
interrupted, one line (no tracebacks), exit 128 + the signal; a re-run finishes every trial once."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest

from gpufill.campaign.run.runner import read_results
from tests.helpers import write_campaign


def _wait_for(condition, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _count(db, status: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return con.execute("SELECT count(*) FROM trials WHERE status = ?", (status,)).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
@pytest.mark.slow
def test_a_signal_stops_the_run_in_one_line_and_a_rerun_finishes_everything_once(tmp_path, signum, code):
    gate = tmp_path / "gate"
    path = write_campaign(tmp_path, projects=2, models=f"tests.campaign_models:gated: {{gate: '{gate}'}}\n  linear: {{}}")
    workdir = tmp_path / "work"
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(workdir)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = workdir / "gpufill.db"
    assert _wait_for(lambda: _count(db, "done") >= 2 and _count(db, "running") >= 1), "the gated trials never started"
    workers = psutil.Process(run.pid).children(recursive=True)
    assert workers, "the run has worker processes"
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=240)  # a busy box is slow; only a hang takes this long
    assert run.returncode == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    name = signal.Signals(signum).name
    assert lines[0].startswith(f"gpufill: interrupted by {name}: 2 done trials kept, ") and "in flight returned to pending" in lines[0], lines
    assert f"resume with: gpufill run {path} --workdir {workdir}" in lines[0]
    time.sleep(1)
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE], "a worker outlived the run"
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT status FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()[0] == "interrupted"
        assert con.execute("SELECT count(*) FROM trials WHERE status = 'running'").fetchone()[0] == 0

    gate.write_text("open")
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    results = read_results(workdir)
    assert len(results) == 4 and results["trial_id"].is_unique and (results["status"] == "done").all()
    assert (results[results["family"] == "linear"]["attempts"] == 1).all()  # finished before the signal: never run again


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_first_signal_is_recorded_and_raised_at_the_next_check_a_second_raises_at_once(signum):
    import os

    from gpufill.campaign.run.stopping import Interrupted, from_exception, signals_interrupt

    before = signal.getsignal(signum)
    with signals_interrupt() as request:
        os.kill(os.getpid(), signum)  # handled between bytecodes: recorded, nothing raised here
        time.sleep(0.05)
        assert request.signum == signum
        with pytest.raises(Interrupted) as first:
            request.check()
        assert from_exception(first.value) == (signal.Signals(signum).name, 128 + int(signum))
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
    assert signal.getsignal(signum) == before  # the previous handler is back
