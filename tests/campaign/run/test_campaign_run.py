"""Running campaigns end to end: resume after kill -9, crashed workers, failing trials, thread budget, bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufill.campaign.run.runner import Campaign, read_results, read_status
from tests.helpers import run_cli, write_campaign



@pytest.mark.slow
def test_a_campaign_runs_every_trial_once_and_resumes_as_a_no_op(tmp_path):
    campaign = Campaign.from_yaml(write_campaign(tmp_path), tmp_path / "work")
    outcome = campaign.run()  # local: the start-up timeline marks a worker ready before its first task is done
    assert (outcome.done, outcome.failed) == (4, 0)  # 2 projects x (mlp + linear)
    results = campaign.results()
    assert sorted(zip(results["project"], results["family"])) == [("p000", "linear"), ("p000", "mlp"), ("p001", "linear"), ("p001", "mlp")]
    assert (results["status"] == "done").all() and (results["attempts"] == 1).all()
    assert (results["mae"] > 0).all() and results["duration_s"].between(0, 60).all()
    # The run log holds the start-up timeline, in order, in seconds since the process started.
    marks = re.findall(r"start-up: (.+?) at ([\d.]+) s", (tmp_path / "work" / "logs" / "run-1.log").read_text())
    assert [name for name, _ in marks] == ["run begins (interpreter, imports, campaign file)", "data loaded", "trials listed", "lanes planned",
                                           "store ready", "workers started", "first worker ready", "first task done", "last task done",
                                           "workers stopped"]
    seconds = [float(at) for _, at in marks]
    assert seconds == sorted(seconds) and 0 < seconds[0] and seconds[-1] - seconds[0] < 600
    again = Campaign.from_yaml(write_campaign(tmp_path), tmp_path / "work").run()
    assert again.done == 0  # nothing left to do
    assert campaign.results()["mae"].tolist() == results["mae"].tolist()


@pytest.mark.slow
def test_kill_9_of_the_scheduler_loses_nothing_finished_and_records_nothing_twice(tmp_path):
    # Long enough (~0.5 s per neural trial) that the kill lands mid-run.
    path = write_campaign(tmp_path, projects=6, epochs=40, models="mlp: {hidden_size: [16, 32]}\n  linear: {}")
    # One trial at a time (no packs), so trials finish one by one and the kill lands between them.
    path.write_text(path.read_text().replace("resources: {retries: 1}", "resources: {retries: 1, pack_size: 1}"))
    workdir = tmp_path / "work"
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(workdir)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    db = workdir / "gpufill.db"
    deadline = time.monotonic() + 120
    done_before: dict[str, float] = {}
    while time.monotonic() < deadline and len(done_before) < 3:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    done_before = dict(con.execute("SELECT trial_id, mae FROM trials WHERE status = 'done'").fetchall())
            except sqlite3.OperationalError:
                pass
        time.sleep(0.1)
    assert len(done_before) >= 3, "the first run finished no trials in time"
    os.kill(process.pid, signal.SIGKILL)  # the scheduler only; its workers notice and exit
    process.wait(timeout=240)  # sized for a loaded box: only a hang reaches it
    total = 6 * 3
    assert read_status(workdir).to_dict()["done"] < total, "the run finished before it could be killed"

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    results = read_results(workdir)
    assert len(results) == total and results["trial_id"].is_unique
    assert (results["status"] == "done").all()
    after = dict(zip(results["trial_id"], results["mae"]))
    assert all(after[tid] == mae for tid, mae in done_before.items())  # finished results unchanged
    finished_first = results[results["trial_id"].isin(done_before)]
    assert (finished_first["attempts"] == 1).all()  # and never run again
    with sqlite3.connect(workdir / "gpufill.db") as con:  # the killed scheduler's workdir lock was taken over, and said so
        messages = [m for (m,) in con.execute("SELECT message FROM events WHERE kind = 'run'")]
    assert any(f"took the workdir over from a run that stopped without releasing it (pid {process.pid}" in m for m in messages), messages


@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_retried_and_the_rest_go_on(tmp_path):
    """A worker killed from outside (kill -9, the OOM killer) is the environment's failure, not the trial's: retried
    without using an attempt (test_integrity.py has the rest of that class)."""
    marker = tmp_path / "killed-once"
    models = f"tests.campaign_models:killed_on_first_try: {{marker: '{marker}'}}\n  linear: {{}}"
    campaign = Campaign.from_yaml(write_campaign(tmp_path, models=models, projects=1, retries=1), tmp_path / "work")
    outcome = campaign.run()
    assert (outcome.crashed, outcome.environment, outcome.retried, outcome.failed) == (1, 1, 0, 0)
    results = campaign.results().set_index("family")
    assert results.loc["tests.campaign_models:killed_on_first_try", "attempts"] == 1
    assert (results["status"] == "done").all()
    store_events = _events(tmp_path / "work", "worker_crashed")
    assert len(store_events) == 1 and "SIGKILL" in store_events[0]


def test_a_trial_that_raises_is_recorded_with_its_traceback_while_others_finish(tmp_path, capsys):
    path = write_campaign(tmp_path, models="tests.campaign_models:always_raises: {}\n  linear: {}", retries=1)
    code, out, _ = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 1  # a failed run
    results = read_results(tmp_path / "work").set_index(["project", "family"])
    failed = results.xs("tests.campaign_models:always_raises", level="family")
    assert (failed["status"] == "failed").all() and (failed["attempts"] == 2).all()
    assert failed["error"].str.contains("ValueError: this model always fails").all()
    assert (results.xs("linear", level="family")["status"] == "done").all()
    with sqlite3.connect(tmp_path / "work" / "gpufill.db") as con:
        traces = [row[0] for row in con.execute("SELECT traceback FROM trials WHERE status = 'failed'")]
    assert all("Traceback" in t and "always fails" in t and "campaign_models.py" in t for t in traces)


@pytest.mark.slow
def test_workers_respect_the_thread_budget(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    models = f"tests.campaign_models:thread_probe: {{report_dir: '{reports}'}}"
    Campaign.from_yaml(write_campaign(tmp_path, models=models, projects=4), tmp_path / "work").run(cpu_slots="auto")
    seen = [json.loads(p.read_text()) for p in reports.iterdir()]
    cores = len(os.sched_getaffinity(0))
    assert 1 <= len(seen) <= cores  # at most one worker per slot
    for report in seen:  # slots x threads <= cores, and every library was told
        assert report["torch_threads"] * len(seen) <= cores
        assert report["omp"] == report["mkl"] == str(report["torch_threads"])


def test_a_workdir_of_another_campaign_is_refused_and_left_untouched(tmp_path, capsys):
    workdir = tmp_path / "work"
    Campaign.from_yaml(write_campaign(tmp_path, name="first", models="linear: {}"), workdir).run(executor="inline")
    before = (workdir / "gpufill.db").read_bytes()
    other = write_campaign(tmp_path, name="second", models="linear: {}")
    code, _, err = run_cli(capsys, "run", other, "--workdir", workdir)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "belongs to campaign 'first'" in err and "--fresh" in err
    assert (workdir / "gpufill.db").read_bytes() == before
    code, _, err = run_cli(capsys, "run", other, "--workdir", workdir, "--fresh")  # no tty, no --yes
    assert code == 2 and "--yes" in err
    code, _, _ = run_cli(capsys, "run", other, "--workdir", workdir, "--fresh", "--yes", "--executor", "inline")
    assert code == 0
    assert read_status(workdir).to_dict()["done"] == 2


@pytest.mark.parametrize(
    ("content", "must_mention"),
    [
        ("name: x\nmodels: {linear: {}\n", ["bad.yaml", "fix:"]),  # malformed YAML
        ("name: x\nmodels: {resnet: {}}\n", ["bad.yaml:2", "resnet", "fix:"]),
        ("name: x\nmodels: {mlp: {width: [1]}}\n", ["bad.yaml:2", "width", "hidden_size"]),
        ("name: x\nmodels: {mlp: {hidden_size: []}}\n", ["bad.yaml:2", "hidden_size", "empty"]),
        ("name: x\ndata: {source: nowhere/*.csv}\nmodels: {linear: {}}\n", ["nowhere/*.csv", "source"]),
        ("name: x\ndata: {source: synthetic, length: 40}\ntask: {lookback: [30]}\nmodels: {linear: {}}\n", ["bad.yaml:3", "lookback", "length"]),
        ("name: x\nmodels: {linear: {}}\nresources: {cpu_slots: 64}\n", ["cpu_slots", "cores"]),
    ],
)
def test_bad_campaigns_exit_2_with_one_line(tmp_path, capsys, content, must_mention):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufill: error:"), err
    for text in must_mention:
        assert text in lines[0], (text, lines[0])
    assert not (tmp_path / "work").exists()  # nothing was started


def test_gpu_slots_without_a_gpu_warn_and_the_cpu_lane_runs_neural_trials(tmp_path, capsys):
    path = write_campaign(tmp_path, models="mlp: {hidden_size: 8}", projects=1)
    code, out, _ = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--gpu-slots", "2", "--executor", "inline")
    assert code == 0
    assert "warning: gpu_slots 2 requested but no GPU is visible" in out
    assert read_status(tmp_path / "work").to_dict()["lanes"]["cpu"]["done"] == 1


def test_status_and_results_commands(tmp_path, capsys, monkeypatch):
    Campaign.from_yaml(write_campaign(tmp_path), tmp_path / "gpufill-tiny").run(executor="inline")
    monkeypatch.chdir(tmp_path)  # the one gpufill-* workdir here is found without --workdir
    code, out, _ = run_cli(capsys, "status", "--json")
    status = json.loads(out)
    assert code == 0 and (status["total"], status["done"], status["lanes"]["cpu"]["done"]) == (4, 4, 4)
    code, out, _ = run_cli(capsys, "results", "--format", "json")
    rows = json.loads(out)
    assert len(rows) == 4
    assert {"trial_id", "project", "family", "params", "seed", "status", "attempts", "lane", "duration_s", "mae", "rmse", "smape", "mase"} <= set(rows[0])
    code, _, _ = run_cli(capsys, "results", "--format", "parquet", "--out", tmp_path / "r.parquet")
    import pandas as pd

    assert code == 0 and len(pd.read_parquet(tmp_path / "r.parquet")) == 4
    code, out, _ = run_cli(capsys, "results", "--summary", "--format", "csv")
    summary = pd.read_csv(__import__("io").StringIO(out))
    assert len(summary) == 4 and set(summary["family"]) == {"mlp", "linear"}
    code, _, err = run_cli(capsys, "results", "--format", "parquet")
    assert code == 2 and "--out" in err


def _events(workdir: Path, kind: str) -> list[str]:
    with sqlite3.connect(workdir / "gpufill.db") as con:
        return [row[0] for row in con.execute("SELECT message FROM events WHERE kind = ?", (kind,))]
