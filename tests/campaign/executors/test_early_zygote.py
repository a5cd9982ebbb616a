"""The zygote `gpufill run` starts at its first line (campaign/worker/early.py): only for commands that train locally,
adopted by a lane's zygote (one thread at import whatever the lane's count; told its GPU later), stopped where no lane
takes it, never left running."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import psutil
import pytest

from gpufill.campaign.executors.base import thread_env
from gpufill.campaign.executors.forked import Zygote
from gpufill.campaign.spec import build_check
from gpufill.campaign.worker import early
from gpufill.errors import InputError
from tests.helpers import write_campaign


@pytest.fixture(autouse=True)
def _no_early_left(monkeypatch):
    monkeypatch.delenv(early.VARIABLE, raising=False)
    monkeypatch.delenv("GPUFILL_FRESH_WORKERS", raising=False)
    yield
    early.stop()


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "c.yaml"], True), (["demo", "--fresh"], True), (["run", "c.yaml", "--executor", "local"], True),
    (["run", "c.yaml", "--executor=local"], True), (["run", "c.yaml", "--executor", "ray"], False),
    (["run", "c.yaml", "--executor=inline"], False), (["run", "--help"], False), (["status"], False), ([], False),
])
def test_only_commands_that_train_in_local_workers_start_one_early(argv, expected):
    assert early.wanted(argv) == (expected and hasattr(os, "pidfd_open"))


def test_the_variables_turn_it_off(monkeypatch):
    monkeypatch.setenv(early.VARIABLE, "0")
    assert not early.wanted(["run", "c.yaml"])
    monkeypatch.setenv(early.VARIABLE, "1")
    monkeypatch.setenv("GPUFILL_FRESH_WORKERS", "1")
    assert not early.wanted(["run", "c.yaml"])


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no zygotes without os.pidfd_open")
def test_an_environment_that_differs_in_what_is_read_at_import_does_not_take_it_and_it_is_stopped():
    early.start(["run", "c.yaml"])
    process = early._early.process
    assert early.take({**os.environ, **thread_env(2)}) is None  # its BLAS pools would be sized at import: wrong
    assert process.poll() is not None  # stopped at once, not left importing torch beside the run
    assert early.take({**os.environ, **thread_env(1)}) is None  # and taken by nobody after


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no zygotes without os.pidfd_open")
def test_a_one_thread_lane_takes_it_with_its_gpu_to_set_before_any_fork():
    early.start(["run", "c.yaml"])
    process = early._early.process
    taken = early.take({**os.environ, **thread_env(1), "CUDA_VISIBLE_DEVICES": "3"})
    assert taken is not None
    got, ours, later = taken
    assert got is process and later == {"CUDA_VISIBLE_DEVICES": "3"}
    ours.close()
    process.kill()
    process.wait(timeout=60)


@pytest.mark.slow  # the zygote imports torch
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no zygotes without os.pidfd_open")
def test_an_adopted_zygote_builds_the_grid_points_and_forks_workers(tmp_path):
    early.start(["run", "c.yaml"])
    started = early._early.process
    check = build_check.BuildCheck.prepare([{"family": "transformer", "axes": {"d_model": [30], "nhead": [4]}, "lookback": 8, "horizon": 1}],
                                           "c.yaml", {(): 1, ("models",): 3, ("models", "transformer"): 4, ("models", "transformer", "d_model"): 5})
    assert check is not None
    zygote = Zygote({**os.environ, **thread_env(1)}, check=(str(check.request), str(check.answer)))
    zygote.start()
    try:
        assert zygote.process is started  # the early one, not a second interpreter importing torch
        check.answered_by(zygote.process)
        with pytest.raises(InputError) as refused:
            check.wait()  # its fork built them, after its imports, and found the bad value
        assert refused.value.one_line().startswith("c.yaml:5: models.transformer.d_model:") and "divisible by nhead" in refused.value.one_line()
        ours, theirs = socket.socketpair()
        child = zygote.fork(theirs.fileno())
        theirs.close()
        assert child is not None and psutil.Process(child.pid).ppid() == started.pid
        Connection(ours.detach()).close()  # the worker sees EOF before its set-up and ends
        assert child.wait(timeout=120) == 0
    finally:
        zygote.close()


MARK = "GPUFILL_TEST_EARLY_MARK"


def _zygotes_marked(value: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "gpufill.campaign.worker.zygote" in " ".join(process.info["cmdline"] or []) and process.environ().get(MARK) == value:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no zygotes without os.pidfd_open")
def test_a_run_refused_for_bad_input_leaves_no_zygote_behind(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nmodels: {nosuchfamily: {}}\n")
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run([sys.executable, "-m", "gpufill", "run", str(path), "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, MARK: mark}, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert _zygotes_marked(mark) == []  # stopped at exit, not left to import torch for nobody
    assert not (tmp_path / "w").exists()


@pytest.mark.slow  # a campaign in a fresh process
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no zygotes without os.pidfd_open")
def test_a_run_with_the_early_zygote_trains_the_same_numbers_as_without(tmp_path):
    path = write_campaign(tmp_path, models="mlp: {hidden_size: [8, 16]}", projects=2, epochs=2)
    maes = {}
    for value in ("1", "0"):
        work = tmp_path / f"w{value}"
        done = subprocess.run([sys.executable, "-m", "gpufill", "run", str(path), "--workdir", str(work)],
                              capture_output=True, text=True, timeout=600, env={**os.environ, early.VARIABLE: value}, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        out = subprocess.run([sys.executable, "-m", "gpufill", "results", "--workdir", str(work), "--format", "json"],
                             capture_output=True, text=True, timeout=300, check=True).stdout
        maes[value] = {row["trial_id"]: row["mae"] for row in json.loads(out)}
    assert len(maes["1"]) == 4 and maes["1"] == maes["0"]  # bit for bit
