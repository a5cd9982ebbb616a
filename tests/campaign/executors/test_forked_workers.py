"""Workers forked from a lane's zygote (executors/forked.py, campaign/worker/zygote.py): the same trials and metrics as
fresh interpreters, exit codes as subprocess gives them, their own process groups, and a fresh start whenever forking
is not possible."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from multiprocessing.connection import Connection

import psutil
import pytest

from gpufill.campaign.executors import forked
from gpufill.campaign.executors.base import thread_env
from gpufill.campaign.executors.forked import Zygote, forks_workers
from gpufill.campaign.worker import zygote as zygote_process
from gpufill.cpus import usable_cpus
from tests.helpers import run_cli, write_campaign


@pytest.fixture
def zygote():
    started = Zygote({**os.environ, **thread_env(1)})  # a one-thread lane's, as executors/local.py starts it
    started.start()
    yield started
    started.close()


def fork_worker(zygote: Zygote) -> tuple[forked.ForkedProcess | None, Connection]:
    ours, theirs = socket.socketpair()
    child = zygote.fork(theirs.fileno())
    theirs.close()
    return child, Connection(ours.detach())


@pytest.mark.slow
def test_a_forked_worker_leads_its_own_group_and_its_exit_codes_come_back_as_popen_gives_them(zygote):
    first, conn = fork_worker(zygote)
    assert first is not None
    parent = psutil.Process(first.pid).parent()
    assert parent is not None and parent.pid == zygote.process.pid
    assert os.getpgid(first.pid) == first.pid  # a kill of its group (executors/local.py) reaches it and what it starts
    conn.close()  # the scheduler went away: the worker ends on its own, as a fresh one does
    assert first.wait(timeout=60) == 0
    second, conn = fork_worker(zygote)
    assert second is not None and second.pid != first.pid
    os.killpg(second.pid, signal.SIGKILL)
    assert second.wait(timeout=60) == -signal.SIGKILL
    conn.close()


@pytest.mark.slow
def test_a_wait_past_its_timeout_raises_as_popen_does(zygote):
    child, conn = fork_worker(zygote)
    assert child is not None
    with pytest.raises(forked.subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.kill()
    assert child.wait(timeout=60) == -signal.SIGKILL
    conn.close()


@pytest.mark.slow
def test_when_the_zygote_is_gone_workers_start_fresh_and_a_lost_exit_code_is_none(zygote):
    child, conn = fork_worker(zygote)
    assert child is not None
    zygote.process.kill()
    zygote.process.wait(timeout=60)
    assert child.wait(timeout=60) is None  # its exit code went with the zygote
    again, other = fork_worker(zygote)
    assert again is None and not zygote.alive  # the executor then starts this worker as a fresh interpreter
    child.kill()
    conn.close()
    other.close()


def test_the_zygote_refuses_a_worker_of_several_threads_where_torch_s_mkl_count_cannot_be_set(monkeypatch):
    from gpufill.forecasting import run

    monkeypatch.setattr(run, "forked_threads_settable", lambda: False)
    refusal = zygote_process.fork_refusal(2)
    assert refusal is not None and "MKL" in refusal and "2 threads" in refusal
    assert zygote_process.fork_refusal(1) is None or "MKL" not in zygote_process.fork_refusal(1)  # one thread needs no setting


def test_the_zygote_refuses_to_fork_with_a_second_thread_running():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        refusal = zygote_process.fork_refusal()
        assert refusal is not None and refusal.startswith("the zygote runs") and "threads" in refusal
    finally:
        stop.set()
        thread.join()


def test_lanes_fork_their_workers_unless_the_environment_variable_says_fresh(monkeypatch):
    monkeypatch.delenv(forked.FRESH_WORKERS_VARIABLE, raising=False)
    assert forks_workers() == (hasattr(os, "pidfd_open") and os.path.isdir("/proc/self/task"))
    monkeypatch.setenv(forked.FRESH_WORKERS_VARIABLE, "1")
    assert not forks_workers()


# A worker's thread counts where each library keeps them, after its start: forked (the zygote's environment, one
# thread, then take_lane_threads) or fresh (the lane's count in its environment from the start).
THREAD_STATE = """
import json, os, sys
import torch
from threadpoolctl import threadpool_info
from gpufill.campaign.worker.worker import take_lane_threads
from gpufill.engine import backend
from gpufill.forecasting.run import use_threads
threads = int(sys.argv[2])
if sys.argv[1] == "forked":
    take_lane_threads(threads)
use_threads(threads)
library = backend._torch_library()
state = {"torch": torch.get_num_threads(), "env": os.environ["OMP_NUM_THREADS"], "omp": library.omp_get_max_threads(),
         "pools": sorted((pool["internal_api"], pool["num_threads"]) for pool in threadpool_info())}
if backend._mkl() is not None:
    state["mkl"] = library.MKL_Get_Max_Threads()
print(json.dumps(state))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS caps its pool at the cores")
@pytest.mark.slow  # two interpreters import torch
def test_a_worker_forked_for_a_lane_of_two_threads_takes_them_as_a_fresh_one_has_them():
    import subprocess
    import sys

    def state(how: str, at_import: int) -> dict:
        done = subprocess.run([sys.executable, "-c", THREAD_STATE, how, "2"], capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, **thread_env(at_import)})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])

    fresh, forked_one = state("fresh", 2), state("forked", 1)
    assert forked_one == fresh
    assert fresh["torch"] == fresh["omp"] == fresh.get("mkl", 2) == 2 and fresh["env"] == "2"
    assert all(count == 2 for _, count in fresh["pools"])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no second thread on one core")
@pytest.mark.slow
def test_a_zygote_that_imported_at_two_threads_refuses_and_the_worker_starts_fresh():
    # why every zygote imports at one thread, whatever its lane's count (executors/local.py)
    many = Zygote({**os.environ, **thread_env(2)})
    many.start()
    try:
        child, conn = fork_worker(many)
        assert child is None and many.alive  # refused: its BLAS pool runs threads (it stays up, but is asked no more)
        conn.close()
    finally:
        many.close()


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_forked_and_fresh_workers_train_the_same_metrics(tmp_path, capsys, monkeypatch, threads):
    if threads > usable_cpus():
        pytest.skip(f"a lane of {threads} threads needs {threads} cores")
    path = write_campaign(tmp_path, models="mlp: {hidden_size: 16}\n  linear: {}\n  rf: {n_estimators: 5}", projects=2)
    # The pack size pinned: measured, it may differ between the runs, and a pack's numbers differ from a lone fit's by rounding.
    path.write_text(path.read_text().replace("resources: {retries: 1}", f"resources: {{retries: 1, pack_size: 1, threads_per_trial: {threads}}}"))
    metrics = {}
    for fresh in ("0", "1"):
        monkeypatch.setenv(forked.FRESH_WORKERS_VARIABLE, fresh)
        work = tmp_path / f"work-{fresh}"
        code, _, err = run_cli(capsys, "run", path, "--workdir", work, "--yes")
        assert code == 0, err
        code, out, _ = run_cli(capsys, "results", "--workdir", work, "--format", "json")
        metrics[fresh] = {(row["project"], row["family"]): (row["mae"], row["rmse"]) for row in json.loads(out)}
    assert len(metrics["0"]) == 6
    assert metrics["0"] == metrics["1"]  # bit for bit: the same process, whether forked or started fresh
