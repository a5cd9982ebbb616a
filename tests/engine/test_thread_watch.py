"""ThreadWatch on made-up step times: when it re-checks, what it picks, how rarely it tries a stalled count again;
and `fit` driven by it (a training whose steps stall at its thread count moves to the other)."""

from __future__ import annotations

import random

import pytest

import torch

from gpufill.engine.loop import fit
from gpufill.engine.measure.thread_watch import COOLDOWN, DRIFT, WINDOW, ThreadWatch
from tests.engine.common import assert_same_weights, mlp, regression


class Machine:
    """Step seconds per thread count, changed by the test; records every count the watch sets."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds = dict(seconds)
        self.threads = 2
        self.set: list[int] = []

    def set_threads(self, threads: int) -> None:
        self.threads = threads
        self.set.append(threads)

    def run(self, watch: ThreadWatch, steps: int) -> list[int]:
        """Run `steps` steps; the thread count each ran at."""
        ran = []
        for _ in range(steps):
            ran.append(self.threads)
            watch.observe(self.seconds[self.threads])
        return ran


def test_a_quiet_machine_is_never_rechecked_and_a_one_off_slow_step_is_noise() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    assert machine.run(watch, 200) == [2] * 200
    ran = []
    for step in range(200):  # a 3x step every 10th: the window's mean stays under DRIFT
        ran.append(machine.threads)
        watch.observe(0.030 if step % 10 == 0 else 0.010)
    assert ran == [2] * 200 and machine.set == [] and watch.log == []


def test_a_stalled_count_is_left_for_the_faster_one() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    machine.run(watch, 20)
    machine.seconds[2] = 0.100  # two busy processes took the cores: every-core steps stall
    ran = machine.run(watch, 20)
    # One 10x step in the window is a mean over DRIFT: the next step runs at 1 thread, and the training stays there.
    assert ran[0] == 2 and ran[1:] == [1] * 19
    assert watch.threads == 1 and watch.reference_s == 0.016
    assert len(watch.log) == 1 and "went on at 1" in watch.log[0] and "(1: 16 ms, 2: 32.5 ms)" in watch.log[0]


def test_a_recheck_that_keeps_the_count_waits_twice_as_long_each_time() -> None:
    machine = Machine({2: 0.010, 1: 0.200})  # one thread is slower still: each re-check keeps 2
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    machine.seconds[2] = 0.030
    ran = machine.run(watch, 400)
    # The kept count's drifted step becomes the reference: nothing drifts further, so one re-check only.
    assert ran.count(1) == 1 and watch.threads == 2 and watch.reference_s == 0.030
    assert "kept 2" in watch.log[0] and f"after {2 * COOLDOWN} steps" in watch.log[0]


def test_a_load_that_keeps_rising_is_rechecked_more_and_more_rarely() -> None:
    machine = Machine({2: 0.010, 1: 100.0})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    ran: list[int] = []
    for _ in range(6):  # every 40 steps the 2-thread step drifts DRIFT+ times further
        machine.seconds[2] *= DRIFT * 1.5
        ran += machine.run(watch, 40)
    rechecks = [i for i, t in enumerate(ran) if t == 1]
    gaps = [b - a for a, b in zip(rechecks, rechecks[1:], strict=False)]
    assert len(rechecks) >= 3 and all(later > earlier for earlier, later in zip(gaps, gaps[1:], strict=False))
    assert watch.threads == 2 and watch.cooldown == COOLDOWN * 2 ** len(rechecks)


def test_no_reference_takes_the_first_window_and_one_count_is_inactive() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, None, set_threads=machine.set_threads)
    machine.run(watch, WINDOW)
    assert watch.reference_s == 0.010
    single = ThreadWatch([2], 2, 0.010, set_threads=machine.set_threads)
    machine.seconds[2] = 1.0
    assert machine.run(single, 50) == [2] * 50 and not single.active and single.log == []


def test_a_step_time_that_doubles_mid_run_switches_the_thread_count() -> None:
    machine = Machine({2: 0.010, 1: 0.014})
    watch = ThreadWatch([2, 1], 2, None, set_threads=machine.set_threads)
    machine.run(watch, 50)
    machine.seconds[2] = 2 * 0.010  # another process took a core: every step at 2 threads now takes twice as long
    ran = machine.run(watch, 50)
    assert watch.threads == 1 and ran[-40:] == [1] * 40 and len(watch.log) == 1


def test_a_steady_training_spends_under_three_percent_on_checks() -> None:
    """10,000 steps of 10 ms +-40 % noise (a busy box's jitter), and the same with the load present all along (every
    count stalls 3x from step 500): the steps run at a count other than the chosen one stay under 3 %."""
    rng = random.Random(0)
    for stalled_from in (None, 500):
        machine = Machine({2: 0.010, 1: 0.016})
        watch = ThreadWatch([2, 1], 2, None, set_threads=machine.set_threads)
        ran = []
        for i in range(10_000):
            ran.append(machine.threads)
            slow = 3.0 if stalled_from is not None and i >= stalled_from else 1.0
            watch.observe(machine.seconds[machine.threads] * slow * rng.uniform(0.6, 1.4))
        checks = sum(t != watch.threads for t in ran)
        assert checks / len(ran) < 0.03, (stalled_from, checks, watch.log)
        if stalled_from is None:
            assert watch.log == []


def test_fit_moves_a_stalling_training_to_the_other_thread_count_and_ends_where_that_count_ends(monkeypatch) -> None:
    """From its 10th watched step on, whatever count the training started at stalls 100x (made-up seconds told to the
    real watch): fit re-checks, goes on at the other count, says so in the plan and its events, and ends within float
    rounding of the same training at that count throughout. With the probe off, nothing is watched."""

    class Stalling(ThreadWatch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.started_at, self.watched = self.threads, 0

        def observe(self, seconds: float) -> None:
            self.watched += 1
            super().observe(0.1 if self.watched > 10 and torch.get_num_threads() == self.started_at else 0.001)

    monkeypatch.setattr("gpufill.engine.training.ThreadWatch", Stalling)
    monkeypatch.setattr("gpufill.engine.measure.thread_watch.cpu_count", lambda: 2)
    # The watch alone: no live trial first (it would choose the count the watch then starts at: test_live_trial.py).
    monkeypatch.setattr("gpufill.engine.measure.live.applies", lambda *args: False)
    torch.set_num_threads(2)  # the plan starts from torch's current count (the fixture restores it)
    x, y = regression(n=256)
    settings = {"device": "cpu", "precision": "fp32", "batch_size": 16, "epochs": 10, "seed": 0, "tune_cache": None}  # 120 steps
    watched = fit(mlp(), (x[:192], y[:192]), (x[192:], y[192:]), **settings)
    started = 1 if watched.plan.threads.value == 2 else 2
    assert watched.plan.threads.reason.startswith(f"{watched.plan.threads.value}: re-checked while training (step drifted to ")
    assert f"went on at {watched.plan.threads.value}" in watched.plan.threads.reason
    drifted = [e for e in watched.events if e.startswith("threads: step drifted to ")]
    assert len(drifted) == 1 and f" at {started} thread" in drifted[0], watched.events
    plain = fit(mlp(), (x[:192], y[:192]), (x[192:], y[192:]), **{**settings, "threads": watched.plan.threads.value})
    assert "re-checked" not in plain.plan.threads.reason
    assert_same_weights(watched.model, plain.model, atol=1e-5)
    unwatched = fit(mlp(), (x[:192], y[:192]), (x[192:], y[192:]), **{**settings, "probe": False})
    assert "re-checked" not in unwatched.plan.threads.reason and not any(e.startswith("threads:") for e in unwatched.events)


def _mkl_state(mkl) -> tuple[int, int]:
    """(MKL's dynamic adjustment, this thread's own MKL count: 0 follows the process-wide one)."""
    local = mkl.MKL_Set_Num_Threads_Local(0)  # returns the count it replaces
    mkl.MKL_Set_Num_Threads_Local(local)
    return mkl.mkl_serv_get_dynamic(), local


def test_set_threads_leaves_mkl_as_a_process_that_never_set_threads_has_it():
    from gpufill.engine.backend import _mkl, set_threads

    mkl = _mkl()
    if mkl is None:
        pytest.skip("this torch has no MKL (its side effect does not exist here)")
    before = torch.get_num_threads()
    previous = mkl.MKL_Set_Num_Threads_Local(0)
    machine = mkl.MKL_Get_Max_Threads()  # MKL's process-wide count (MKL_NUM_THREADS, else the cores)
    mkl.MKL_Set_Num_Threads_Local(previous)
    try:
        torch.set_num_threads(machine)
        assert _mkl_state(mkl) == (0, machine)  # torch's own call: MKL pinned, not dynamic (nested gemms oversubscribe)
        set_threads(machine)
        assert _mkl_state(mkl) == (1, 0) and torch.get_num_threads() == machine  # MKL dynamic at its own count, as at start
        if machine > 1:
            set_threads(machine - 1)  # fewer: MKL follows OpenMP's count, never more than asked
            assert _mkl_state(mkl) == (1, 0) and mkl.MKL_Get_Max_Threads() == torch.get_num_threads() == machine - 1
    finally:
        set_threads(before)


_FRESH_PROCESS = """
import threading, torch
from gpufill.engine.backend import _native_threads, set_threads
machine = torch.get_num_threads()
set_threads(1)
seen = []
worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
worker.start(); worker.join()
print(_native_threads() is not None, machine, torch.get_num_threads(), seen[0])
"""


@pytest.mark.slow
def test_set_threads_leaves_torch_process_wide_count_unset():
    """torch's own call stores the count process-wide, and every thread that starts torch work (OpenMP's workers inside
    each parallel region among them) applies it again, pinning MKL there: the character LM's attention 2x slower.
    `set_threads` sets this thread's OpenMP count only: a new thread starts at the machine's count, as in a process that
    never set threads (a fresh process: this one's earlier tests may have called torch's function)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, check=True, timeout=300).stdout.split()
    native, machine, here, new_thread = out[0] == "True", int(out[1]), int(out[2]), int(out[3])
    if not native:
        pytest.skip("torch's parallel backend is not OpenMP here: torch's own call is used")
    if machine == 1:
        pytest.skip("one thread by default here (one core, or OMP_NUM_THREADS=1): a new thread's count tells nothing")
    assert here == 1
    assert new_thread == machine  # torch.set_num_threads(1) would give 1 here
