"""The same numbers on every re-run: a packed campaign killed with -9 three times and resumed, with a busy core beside
it for part of the time, gives every trial the bit-for-bit metrics of an uninterrupted run (bd3c8d8: 16 of 36 trials
differed by up to 1e-3, their precision chosen by timing; a leftover trial trained alone instead of in a pack)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufill.campaign.policy.messages import PackOrder, Task

from gpufill.campaign.results.reading import read_results

WAIT_S = 600.0
"""A condition waited on (trials finished, a killed run gone), sized for a loaded 2-core box."""
TOTAL = 6 * 3 * 2


def campaign(folder: Path) -> Path:
    path = folder / "numerics.yaml"
    path.write_text("name: numerics\n"
                    "data: {source: synthetic, projects: 6, length: 400, seed: 0}\n"
                    "task: {lookback: [16], horizon: 1}\n"
                    "models:\n  mlp: {hidden_size: [16, 32]}\n  lstm: {hidden_size: 8}\n"
                    "train: {epochs: 25, early_stopping: null}\n"  # precision left to gpufill: bf16 allowed where the CPU has it
                    "seeds: [0, 1]\n"
                    "resources: {retries: 0, pack_size: 4}\n")
    return path


def command(path: Path, workdir: Path) -> list[str]:
    return [sys.executable, "-m", "gpufill", "run", str(path), "--workdir", str(workdir), "--yes"]


def finished(workdir: Path) -> int:
    with contextlib.suppress(sqlite3.Error):
        with contextlib.closing(sqlite3.connect(f"file:{workdir / 'gpufill.db'}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT COUNT(*) FROM trials WHERE status = 'done'").fetchone()[0])
    return 0


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """Another process spinning on a core: the timing a choice made by measuring would see flips."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait(timeout=60)


def killed_after(path: Path, workdir: Path, trials: int) -> int:
    """Start the run, kill -9 it (the scheduler and its workers) once `trials` are done; how many were done then."""
    process = subprocess.Popen(command(path, workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + WAIT_S
    while finished(workdir) < trials and process.poll() is None:
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {trials} trials"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=WAIT_S)
    return finished(workdir)


@pytest.mark.slow
def test_a_packed_campaign_killed_three_times_under_load_ends_bit_for_bit_as_an_uninterrupted_run(tmp_path):
    path = campaign(tmp_path)
    whole = subprocess.run(command(path, tmp_path / "whole"), capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert whole.returncode == 0, whole.stderr[-2000:]
    reference = read_results(tmp_path / "whole")
    assert len(reference) == TOTAL and (reference["status"] == "done").all()

    workdir = tmp_path / "killed"
    done = [killed_after(path, workdir, 4)]
    with busy_core():  # the second and third parts run beside a busy core
        done.append(killed_after(path, workdir, done[-1] + 8))
        done.append(killed_after(path, workdir, done[-1] + 8))
    assert done[-1] < TOTAL, f"the runs finished before the third kill ({done})"
    last = subprocess.run(command(path, workdir), capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert last.returncode == 0, last.stderr[-2000:]

    resumed = read_results(workdir)
    assert len(resumed) == TOTAL and resumed["trial_id"].is_unique and (resumed["status"] == "done").all()  # none lost, none twice
    expected = dict(zip(reference["trial_id"], zip(reference["mae"], reference["rmse"], strict=True), strict=True))
    got = dict(zip(resumed["trial_id"], zip(resumed["mae"], resumed["rmse"], strict=True), strict=True))
    changed = {trial for trial in expected if got[trial] != expected[trial]}
    assert changed == set()  # bit for bit: every trial trained the same numbers


def runner_and_trials(tmp_path: Path, train: str = "") -> tuple:
    from gpufill.campaign.spec.spec import load_campaign
    from gpufill.campaign.trials.trials import expand
    from gpufill.campaign.worker.worker import TrialRunner

    path = campaign(tmp_path)
    if train:
        path.write_text(path.read_text().replace("train: {epochs: 25, early_stopping: null}", f"train: {{epochs: 3, early_stopping: null, {train}}}"))
    else:
        path.write_text(path.read_text().replace("epochs: 25", "epochs: 3"))
    spec = load_campaign(path)
    trials = expand(spec, {name: project.fingerprint() for name, project in spec.load_projects().items()})
    return TrialRunner(spec.model_dump(mode="json"), tmp_path, threads=1, device="cpu"), [t for t in trials if t.family == "mlp" and t.params == {"hidden_size": 16}]


def test_a_lone_trial_of_a_fused_shape_trains_the_numbers_it_has_in_a_full_pack(tmp_path):
    """After a kill a shape's last trial can be left alone: it trains as a pack of one, not unfused (whose numbers
    differ in the last bits: a resumed run would not match an uninterrupted one)."""
    runner, trials = runner_and_trials(tmp_path)
    assert len(trials) >= 4
    kind = "hand-written fused kernels"
    full = runner.run_task(Task(tuple(trials[:4]), PackOrder(4, kind)))
    alone = runner.run_task(Task(tuple(trials[3:4]), PackOrder(4, kind)))
    by_id = {o.trial_id: o for o in full.outcomes}
    (lone,) = alone.outcomes
    assert lone.ok and lone.trial_id == trials[3].trial_id and lone.result is not None
    assert lone.result.metrics["test"] == by_id[lone.trial_id].result.metrics["test"]  # bit for bit
    assert "trained in a pack of 1" in " ".join(lone.result.events)


@pytest.mark.parametrize(("train", "expected"), [("", "fp32"), ("precision: bf16", "bf16"), ("precision: fp32", "fp32")])
def test_a_campaigns_cpu_trials_never_choose_their_precision_by_timing(tmp_path, train, expected):
    """bf16 on a CPU is chosen by timing where left to gpufill; in a campaign it is fp32 unless the file asks for bf16,
    even on a CPU with bf16 instructions: nothing is timed (no probe stage, no live trial), and the plan says why."""
    import dataclasses

    from gpufill.engine.hardware import detect
    from gpufill.engine.measure import live
    from gpufill.engine.plan import _precision

    runner, trials = runner_and_trials(tmp_path, train)
    config = runner.setup(trials[0]).config
    assert config.timed_precision is False
    bf16_cpu = dataclasses.replace(detect("cpu"), bf16_supported=True)
    choice = _precision(bf16_cpu, config.precision, timed=config.timed_precision)
    assert choice.value == expected
    assert ("not timed against bf16 autocast" in choice.reason) == (not train)
    assert not live.applies(dataclasses.replace(config, threads=1), bf16_cpu, False)  # no live trial switches it while training
