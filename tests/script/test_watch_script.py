"""`gpufill watch -- COMMAND` on plain PyTorch scripts (tests/user_scripts/): the whole run recorded,
the command's output and exit code passed through, Slurm named, SIGTERM passed on, and the HTML
report as headless Chromium shows it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufill.monitor.alerts import input_wait
from gpufill.monitor.summary import summarise
from gpufill.script.watch import default_folder, slurm_job
from tests.helpers import CHROMIUM, USER_SCRIPTS, check_in_chromium


def watch_command(*args: str, script: str = "steady_training.py", script_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "gpufill", "watch", *args, "--", sys.executable, str(USER_SCRIPTS / script), *script_args]


@pytest.mark.slow
def test_a_whole_run_is_recorded_and_passes_its_output_through(tmp_path):
    out = tmp_path / "recording"
    run = subprocess.run(watch_command("--out", str(out), "--interval", "0.25"), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # The command's stdout is its own: its lines, in order, and nothing of gpufill's.
    assert run.stdout.splitlines()[0].startswith("epoch 0: loss") and run.stdout.splitlines()[-1] == "finished 60 steps"
    assert "gpufill watch" not in run.stdout and "gpufill watch" in run.stderr and "report: " in run.stderr
    record = json.loads((out / "watch.json").read_text())
    assert record["exit_code"] == 0 and record["optimizer_steps"] == 60
    assert record["measured_steps"] == 57  # 60 steps, 3 of them warm-up
    assert record["stop_reason"] == "the script ended after 60 optimizer steps"
    assert record["training"]["optimizer"] == "SGD" and record["training"]["loaders"][0]["at"].endswith("steady_training.py:28")
    assert record["samples_per_s"] == pytest.approx(32 / (record["step_ms"] / 1e3), rel=1e-3)
    assert sum(record["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    # The step timeline: every step after the first (the first has no start) lands in one interval.
    timeline = [json.loads(line) for path in out.glob("steps-0-*.jsonl") for line in path.read_text().splitlines()]
    assert sum(bucket["steps"] for bucket in timeline) == 59
    assert all(bucket["t1"] >= bucket["t0"] and bucket["data_s"] <= bucket["step_s"] for bucket in timeline)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    host = [row for row in samples if row["source"] == "host"]
    assert len(host) >= 4 and record["machine"]["host"]["samples"] == len(host)
    assert max(row["workers_rss"] for row in host) > 100 * 2**20  # the command (torch imported) was found and measured
    assert record["slurm"] == {} and "Slurm job" not in run.stderr
    page = (out / "report.html").read_text()
    assert "<p id='verdict'>" in page and "finished" not in page
    assert page.count("<img class='plot'") == 5  # step breakdown, step time + steps/s, host CPU + RAM (no GPU here)
    if CHROMIUM.exists():
        assert check_in_chromium(out / "report.html", tmp_path, must_contain=('<table id="summary">', 'id="verdict"', 'id="breakdown"')) == 5


@pytest.mark.slow
def test_a_crashing_script_keeps_its_exit_code_and_gets_its_partial_record(tmp_path):
    out = tmp_path / "crash"
    run = subprocess.run(watch_command("--out", str(out), script="crash_at_step3.py"), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" in run.stderr  # the script's own traceback, passed through
    record = json.loads((out / "watch.json").read_text())
    assert record["exit_code"] == 1 and record["optimizer_steps"] == 3
    assert record["stop_reason"] == "the script raised RuntimeError after 3 steps" and "crash_at_step3.py:12" in record["error"]
    assert record["verdict"] is None and (out / "report.html").exists()
    # Running again into the same folder would mix two runs: one line, exit 2, the first run's files untouched.
    again = subprocess.run(watch_command("--out", str(out), script="crash_at_step3.py"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "already holds a watched run" in again.stderr
    assert json.loads((out / "watch.json").read_text()) == record


@pytest.mark.slow
def test_inside_a_slurm_job_the_job_is_named_and_gives_the_folder_its_name(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURMD_NODENAME": "gpu-07"}
    run = subprocess.run(watch_command(script_args=("1",)), capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "gpufill-watch-4242" / "watch.json").read_text())
    assert record["slurm"] == {"job_id": "4242", "job_name": "train", "task": "0", "tasks": "1", "node": "gpu-07"}
    assert "Slurm job 4242 task 0" in run.stderr and record["optimizer_steps"] == 30


@pytest.mark.slow
def test_sigterm_to_watch_reaches_the_script_and_the_record_is_still_written(tmp_path):
    out = tmp_path / "stopped"
    process = subprocess.Popen(watch_command("--out", str(out), script_args=("50", "0.02")), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("steps-0-*.jsonl")) and time.monotonic() < deadline:  # the training is under way
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    record = json.loads((out / "watch.json").read_text())
    assert record["exit_code"] == 143 and record["stop_reason"].startswith("the script was stopped by SIGTERM after ")
    assert 0 < record["optimizer_steps"] < 50 * 30 and (out / "report.html").exists()


@pytest.mark.slow
def test_a_missing_command_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "gpufill", "watch", "--out", str(tmp_path / "w"), "--", "no-such-command-here"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "'no-such-command-here' is not a command here" in run.stderr
    assert not (tmp_path / "w").exists()


# -- the pieces, with constructed numbers ---------------------------------------------------------
def test_slurm_variables_and_the_default_folder():
    env = {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    slurm = slurm_job(env)
    assert slurm == {"job_id": "77", "array_job_id": "70", "array_task_id": "7", "task": "1", "tasks": "2"}
    assert default_folder(slurm) == Path("gpufill-watch-70_7-task1")  # one folder per array element and srun task
    assert default_folder({"job_id": "77", "task": "0", "tasks": "1"}) == Path("gpufill-watch-77")
    assert default_folder({}, now=0.0).name.startswith("gpufill-watch-19")


def test_input_wait_alerts_a_long_stretch_of_waiting_for_data():
    def bucket(t: float, data: float) -> dict:
        return {"t0": t, "t1": t + 1.0, "steps": 10, "step_s": 1.0, "data_s": data, "copy_s": 0.05}

    buckets = [bucket(t, 0.1) for t in range(10)] + [bucket(t, 0.6) for t in range(10, 50)] + [bucket(t, 0.1) for t in range(50, 60)]
    (alert,) = input_wait(buckets, share=0.4, min_duration_s=30)
    assert (alert.kind, alert.ts, alert.duration_s) == ("input_wait", 10, 40)
    assert "waited for data 65% of its step time for 40 s" in alert.message
    assert input_wait(buckets, share=0.4, min_duration_s=45) == []


def test_only_harmful_throttling_counts_in_the_summary():
    rows = [{"ts": float(i), "source": "gpu0", "gpu_util": 50.0, "mem_used": 2**30, "power_w": 300.0, "temp_c": 60.0 + i, "sm_clock_mhz": 1980.0,
             "throttle": reasons} for i, reasons in enumerate([["idle"], ["power_cap"], '["thermal"]', [], ["sync_boost"]])]
    gpu = summarise(rows)["gpu0"]
    assert gpu["throttled_samples"] == 2 and gpu["temp_c_peak"] == 64.0 and gpu["util_percent_mean"] == 50.0


@pytest.mark.gpu
def test_on_a_gpu_the_watch_records_the_gpu_and_the_copies(tmp_path):
    out = tmp_path / "gpu"
    run = subprocess.run(watch_command("--out", str(out), "--interval", "0.5", script="cuda_training.py", script_args=("3",)),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads((out / "watch.json").read_text())
    assert record["training"]["device"].startswith("cuda") and record["optimizer_steps"] == 3 * 32
    assert record["machine"]["gpu0"]["samples"] >= 2 and record["machine"]["gpu0"]["memory_used_gib_peak"] > 0
    assert record["shares"]["copy"] > 0  # the host-to-device copies were timed
    assert any(site.endswith("cuda_training.py:29") for site in record["syncs"])  # loss.item() every step: a sync on a GPU
    page = (out / "report.html").read_text()
    assert page.count("<img class='plot'") >= 5 + 4  # + GPU utilisation, memory, power, temperature (and the SM clock)
