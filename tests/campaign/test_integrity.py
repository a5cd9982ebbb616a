"""Issue 26, integrity: every stored result matches the data its id names, data a result could not honestly be
computed from is refused at load (one line naming file, column and row), failures of the environment use no
retries and a plain re-run finishes the campaign, and `status`/`monitor`/`watch` never show a dead run as alive."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from rich.console import Console

from gpufill.campaign.executors import base
from gpufill.campaign.policy import environment
from gpufill.campaign.worker.attempt import attempt
from gpufill.campaign.store.lock import WorkdirLock
from gpufill.campaign.results.reading import read_status
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import Trial
from gpufill.forecasting.data import load_projects, rmse
from gpufill.cli.live import render, snapshot
from tests.helpers import a_result, a_trial, run_cli

WAIT_S = 180.0
"""How long a test waits for a condition (a loaded CI box is slow; the condition ends the wait)."""


def wait_for(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def rows(workdir: Path, query: str, args: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{workdir / 'gpufill.db'}?mode=ro", uri=True)) as con:
        return con.execute(query, args).fetchall()


def store_rows(workdir: Path, query: str) -> list[tuple]:
    """`rows`, or [] while the store does not exist yet (or is being created)."""
    if not (workdir / "gpufill.db").exists():
        return []
    try:
        return rows(workdir, query)
    except sqlite3.OperationalError:
        return []


def series(scale: float = 1.0, shift: float = 0.0, length: int = 160) -> dict[str, np.ndarray]:
    t = np.arange(length)
    return {name: scale * (np.sin(t / (5 + i)) + 0.1 * i * np.cos(t / 3)) + shift for i, name in enumerate(("a", "b"))}


def write_data(path: Path, values: dict[str, np.ndarray]) -> None:
    """One CSV holding every project (project column), written whole and swapped in at once (as a tool re-exporting it would)."""
    frame = pd.concat([pd.DataFrame({"project": name, "time": np.arange(len(v)), "target": v}) for name, v in values.items()])
    temporary = path.with_name(path.name + ".tmp")
    frame.to_csv(temporary, index=False)
    os.replace(temporary, path)


def data_campaign(tmp_path: Path, models: str, resources: str = "retries: 1") -> Path:
    path = tmp_path / "study.yaml"
    path.write_text("name: study\ndata: {source: data.csv}\ntask: {lookback: [12], horizon: 1}\n"
                    f"models:\n  {models}\ntrain: {{epochs: 2, early_stopping: null}}\nseeds: [0]\nresources: {{{resources}}}\n")
    return path


def metrics_by_trial(workdir: Path) -> dict[str, tuple]:
    return {tid: (mae, rmse_, fp) for tid, mae, rmse_, fp in rows(workdir, "SELECT trial_id, mae, rmse, data_fingerprint FROM trials WHERE status = 'done'")}


def assert_same_results(stored: dict[str, tuple], expected: dict[str, tuple]) -> None:
    """The same trial ids, fingerprints and metrics (to training's float tolerance: a run measures its own speed settings;
    the replaced data in these tests moves every metric by far more)."""
    assert sorted(stored) == sorted(expected)
    for trial_id, (mae, rmse_, fingerprint) in stored.items():
        assert fingerprint == expected[trial_id][2] != ""
        assert (mae, rmse_) == pytest.approx(expected[trial_id][:2], rel=1e-3)


def reference(tmp_path: Path, path: Path, data: dict[str, np.ndarray]) -> dict[str, tuple]:
    """The campaign's metrics on `data` alone (a clean run in its own workdir): what each trial id must store."""
    write_data(tmp_path / "data.csv", data)
    outcome = Campaign.from_yaml(path, tmp_path / "reference").run(cpu_slots=1, executor="inline")  # a local worker's metrics, no process
    assert outcome.failed == 0
    return metrics_by_trial(tmp_path / "reference")


def stored_truth(workdir: Path, trial_id: str, project: str) -> np.ndarray:
    store = Store.open(workdir)
    try:
        return store.forecasts([trial_id])[(trial_id, project)]["truth"][:, 0]
    finally:
        store.close()


# --- class 1: results match the data they claim ----------------------------------------------------


@pytest.mark.slow
def test_a_data_file_replaced_mid_run_stores_every_trial_under_the_data_it_trained_on(tmp_path):
    """The worker has started; the file is replaced, the worker killed: its fresh successor starts from the data the
    scheduler read (handed over: executors/base.py), so every trial trains on the data its id names and none is
    charged for the kill. (A worker that reads the file itself refuses data its trials' ids do not name: the tests
    below, with the data not handed.)"""
    gate, pid_file = tmp_path / "gate", tmp_path / "worker.pid"
    path = data_campaign(tmp_path, f"tests.integrity_models:held: {{gate: '{gate}', pid_file: '{pid_file}'}}\n  linear: {{}}",
                         "retries: 0, pack_size: 1")
    original, replaced = series(), series(scale=10.0, shift=5.0)
    gate.write_text("open")
    expected = reference(tmp_path, path, original)
    assert len(expected) == 4
    gate.unlink()
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(tmp_path / "work"), "--cpu-slots", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the first trial to start"))
        write_data(tmp_path / "data.csv", replaced)
        os.kill(worker, signal.SIGKILL)  # its successor starts after the file changed
        gate.write_text("open")  # nothing holds a trial any more
        out, err = process.communicate(timeout=WAIT_S)
    finally:
        gate.write_text("open")
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert_same_results(metrics_by_trial(tmp_path / "work"), expected)  # every trial id holds what its own data gives
    assert rows(tmp_path / "work", "SELECT DISTINCT attempts FROM trials") == [(1,)]  # retries: 0, and nothing was charged
    assert rows(tmp_path / "work", "SELECT COUNT(*) FROM events WHERE kind = 'trial_failed'") == [(0,)]
    for trial_id, project in rows(tmp_path / "work", "SELECT trial_id, project FROM trials"):
        truth = stored_truth(tmp_path / "work", trial_id, project)
        np.testing.assert_allclose(truth, original[project][-len(truth):], rtol=1e-6)  # float32 as stored
    assert "environment failures retried without using an attempt" in " ".join(out.split())


def test_data_changed_before_the_workers_read_it_trains_only_what_still_matches_and_a_rerun_after_restoring_finishes(tmp_path, monkeypatch, capsys):
    """Project b's values change between the scheduler's reading and the workers' (in a fused pack too): b's trials
    wait (no attempt used), a's train; the run ends saying so (exit 1); restored, a plain re-run finishes them."""
    path = data_campaign(tmp_path, "mlp: {hidden_size: 8}\n  linear: {}", "retries: 0")
    original = series()
    expected = reference(tmp_path, path, original)
    changed = {**original, "b": original["b"] * 3.0}
    monkeypatch.setattr(environment, "PAUSES_S", (0.1,))
    monkeypatch.setattr(environment, "TRIAL_LIMIT", 2)
    monkeypatch.setattr(base, "HANDED_DATA_LIMIT_BYTES", -1)  # workers read the file, as Ray's, Slurm's and large data's do
    prepare = Campaign.prepare

    def prepare_then_change(self, **kwargs):
        prepared = prepare(self, **kwargs)
        write_data(tmp_path / "data.csv", changed)  # after the run read it, before any worker does
        return prepared

    monkeypatch.setattr(Campaign, "prepare", prepare_then_change)
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 1
    assert err.count("\n") == 1 and "gpufill: 2 trials are left pending because the environment kept failing them" in err
    assert "the data of project b changed since the run began" in err and f"gpufill run {path} --workdir {tmp_path / 'work'}" in err
    by_project = dict(rows(tmp_path / "work", "SELECT project, GROUP_CONCAT(status || ':' || attempts) FROM trials GROUP BY project"))
    assert by_project == {"a": "done:1,done:1", "b": "pending:0,pending:0"}
    monkeypatch.setattr(Campaign, "prepare", prepare)
    write_data(tmp_path / "data.csv", original)
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    assert "2 trials an earlier run left pending after environment failures (not counted as attempts) are run again" in " ".join(out.split())
    assert_same_results(metrics_by_trial(tmp_path / "work"), expected)
    assert rows(tmp_path / "work", "SELECT DISTINCT attempts FROM trials") == [(1,)]


def test_data_changed_after_the_scheduler_read_it_trains_what_the_ids_name_where_the_workers_were_handed_it(tmp_path, monkeypatch, capsys):
    """Small data is handed to the workers (executors/base.py: hand_data): they train on the values the scheduler read
    and the trial ids name, whatever the file holds by then; every trial finishes with the original data's metrics."""
    path = data_campaign(tmp_path, "mlp: {hidden_size: 8}\n  linear: {}", "retries: 0")
    original = series()
    expected = reference(tmp_path, path, original)
    prepare = Campaign.prepare

    def prepare_then_change(self, **kwargs):
        prepared = prepare(self, **kwargs)
        write_data(tmp_path / "data.csv", {**original, "b": original["b"] * 3.0})
        return prepared

    monkeypatch.setattr(Campaign, "prepare", prepare_then_change)
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    assert rows(tmp_path / "work", "SELECT DISTINCT status, attempts FROM trials") == [("done", 1)]
    assert_same_results(metrics_by_trial(tmp_path / "work"), expected)


def test_project_ids_are_kept_as_text(tmp_path, capsys):
    values = {name: (np.arange(60.0) * (i + 2)) % 11 + 100 * i for i, name in enumerate(("007", "7", "0042"))}  # exact in a CSV
    interleaved = pd.DataFrame([(name, step, v[step]) for step in range(60) for name, v in values.items()], columns=["client", "step", "target"])
    interleaved.to_csv(tmp_path / "clients.csv", index=False)
    loaded = load_projects(str(tmp_path / "clients.csv"), project_column="client")
    assert sorted(loaded) == ["0042", "007", "7"]  # not 7 (two series interleaved) and 42
    for name, project in loaded.items():
        np.testing.assert_array_equal(project.target, values[name])
    (tmp_path / "ids.yaml").write_text("name: ids\ndata: {source: clients.csv, project_column: client, time_column: step}\n"
                                       "task: {lookback: [6], horizon: 1}\nmodels:\n  linear: {}\nseeds: [0]\n")
    code, _out, err = run_cli(capsys, "run", tmp_path / "ids.yaml", "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    assert sorted(p for (p,) in rows(tmp_path / "work", "SELECT project FROM trials WHERE status = 'done'")) == ["0042", "007", "7"]
    for trial_id, project in rows(tmp_path / "work", "SELECT trial_id, project FROM trials"):
        truth = stored_truth(tmp_path / "work", trial_id, project)
        np.testing.assert_array_equal(truth, values[project][-len(truth):])


def refusal(capsys, tmp_path, frame: pd.DataFrame, extra: str = "") -> str:
    """`gpufill run` on a campaign over `frame` (as data.csv): exit 2 and one line, the workdir untouched."""
    frame.to_csv(tmp_path / "data.csv", index=False)
    (tmp_path / "bad.yaml").write_text(f"name: bad\ndata: {{source: data.csv{extra}}}\ntask: {{lookback: [4], horizon: 1}}\nmodels:\n  linear: {{}}\n"
                                       "seeds: [0]\n")
    code, _out, err = run_cli(capsys, "run", tmp_path / "bad.yaml", "--workdir", tmp_path / "work")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "work").exists()
    return err.strip()


@pytest.mark.parametrize("times, shown, line_a, line_b", [
    ([0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10], "3", 5, 6),
    (["2024-01-03", "2024-01-01", "2024-01-02", "2024-01-04", "2024-01-05", "2024-01-06", "2024-01-07", "2024-01-08", "2024-01-09",
      "2024-01-10", "2024-01-01", "2024-01-11"], "2024-01-01", 3, 12),
])
def test_duplicated_timestamps_are_refused_naming_file_column_and_rows(tmp_path, capsys, times, shown, line_a, line_b):
    err = refusal(capsys, tmp_path, pd.DataFrame({"time": times, "target": np.arange(12.0)}))
    assert err == (f"gpufill: error: {tmp_path / 'data.csv'}: time: time {shown} appears 2 times: line {line_a} and line {line_b}; fix: keep one "
                   "row per time step (aggregate or drop the duplicates); if the file holds several series, set data.project_column to the column "
                   "that tells them apart")


def test_duplicated_timestamps_within_one_project_of_a_shared_file_name_the_project(tmp_path, capsys):
    frame = pd.DataFrame({"project": ["x"] * 6 + ["y"] * 6, "time": [0, 1, 2, 3, 4, 5, 0, 1, 2, 2, 3, 4], "target": np.arange(12.0)})
    err = refusal(capsys, tmp_path, frame)
    assert err.startswith(f"gpufill: error: {tmp_path / 'data.csv'} (project y): time: time 2 appears 2 times: line 10 and line 11; fix: ")


@pytest.mark.parametrize("cell", ["abc", "12kg", "1,5"])
def test_a_text_cell_in_a_numeric_covariate_is_refused_naming_it(tmp_path, capsys, cell):
    price = [str(0.5 * i) for i in range(12)]
    price[7] = cell
    err = refusal(capsys, tmp_path, pd.DataFrame({"time": range(12), "target": np.arange(12.0), "price": price}))
    assert err == (f"gpufill: error: {tmp_path / 'data.csv'}: price: column holds numbers but {cell!r} at line 9 is text (1 text cell(s)), so the "
                   "whole column would be read as text and left out; fix: replace the text with a number, or empty the cell and set data.fill")


def test_a_text_column_is_still_left_out_and_an_empty_cell_follows_the_fill_policy(tmp_path):
    price = [0.5 * i for i in range(12)]
    price[7] = None
    pd.DataFrame({"time": range(12), "target": np.arange(12.0), "weekday": list("mtwtfss") + list("mtwtf"), "price": price}).to_csv(
        tmp_path / "data.csv", index=False)
    project = load_projects(str(tmp_path / "data.csv"), fill="interpolate")["data"]
    assert project.covariate_names == ("price",) and project.covariates[7, 0] == pytest.approx(3.5)


@pytest.mark.parametrize("value, message", [
    (3.5e38, "values up to 3.5e+38 in column 'target' (at line 8) would overflow the stored float32 forecasts (at most 1e+38 is accepted); "
             "fix: divide the column by a power of ten in the file (e.g. 1e35)"),
    (1e100, "values up to 1e+100 in column 'target' (at line 8) would overflow the stored float32 forecasts (at most 1e+38 is accepted); "
            "fix: divide the column by a power of ten in the file (e.g. 1e97)"),
])
def test_values_that_do_not_fit_float32_are_refused_at_load(tmp_path, capsys, value, message):
    target = np.arange(1.0, 13.0)
    target[6] = value
    err = refusal(capsys, tmp_path, pd.DataFrame({"time": range(12), "target": target}))
    assert err.startswith(f"gpufill: error: {tmp_path / 'data.csv'}: target: {message}")


def test_a_column_of_tiny_values_is_refused_and_tiny_errors_are_scored(tmp_path, capsys):
    err = refusal(capsys, tmp_path, pd.DataFrame({"time": range(12), "target": 1e-300 * np.arange(1.0, 13.0)}))
    assert err == (f"gpufill: error: {tmp_path / 'data.csv'}: target: values in column 'target' are all smaller than 1e-30 in magnitude (the "
                   "largest is 1.2e-299): float32 forecasts and squared errors lose them to 0; fix: multiply the column by a power of ten in the file "
                   "(e.g. 1e299); metrics are then in those units")
    assert rmse(np.array([1e-300, -3e-300]), np.zeros(2)) == pytest.approx(np.sqrt(5.0) * 1e-300, rel=1e-12)  # not 0.0
    assert rmse(np.array([1e200, 1e200]), np.zeros(2)) == pytest.approx(1e200, rel=1e-12)  # not inf


def test_large_values_within_the_limit_store_finite_forecasts_and_valid_json(tmp_path, capsys):
    t = np.arange(120)
    pd.DataFrame({"time": t, "target": 1e37 * (2.0 + np.sin(t / 5))}).to_csv(tmp_path / "data.csv", index=False)
    (tmp_path / "big.yaml").write_text("name: big\ndata: {source: data.csv}\ntask: {lookback: [6], horizon: 1}\nmodels:\n  linear: {}\nseeds: [0]\n")
    code, _out, err = run_cli(capsys, "run", tmp_path / "big.yaml", "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    code, out, err = run_cli(capsys, "results", "--workdir", tmp_path / "work", "--ensemble", "median", "--format", "json")
    assert code == 0, err

    def refuse(constant):
        raise AssertionError(f"{constant} in JSON output")

    (row,) = json.loads(out, parse_constant=refuse)
    assert 0 < row["mae"] < 1e37
    forecast = np.asarray(load_forecast(tmp_path / "work"))
    assert np.isfinite(forecast).all() and forecast.max() > 1e37


def load_forecast(workdir: Path) -> np.ndarray:
    ((trial_id, project),) = rows(workdir, "SELECT trial_id, project FROM trials")
    store = Store.open(workdir)
    try:
        return store.forecasts([trial_id])[(trial_id, project)]["forecast"]
    finally:
        store.close()


def test_a_forecast_past_float32_fails_its_trial_with_the_reason():
    fine = {"mae": 1.0, "rmse": 1.0, "smape": 1.0, "mase": 1.0}
    scored = a_result(fine, fine, forecasts={"p0": {"forecast": [[1.0], [float("inf")]]}})
    outcome = attempt(a_trial(), lambda: scored)
    assert outcome.ok is False and outcome.environment is False
    assert outcome.error.startswith("NonFiniteMetrics: forecasts of p0 are not finite in float32 (the store keeps them so; its largest is 3.4e+38)")


# --- class 2: retries are the trial's, not the environment's ------------------------------------------


@pytest.mark.slow
def test_a_data_file_missing_for_a_few_seconds_uses_no_retry(tmp_path, monkeypatch):
    """retries: 0, and the data file is gone when the workers first read it: the trials wait, the file comes back,
    every trial finishes in the same run with one attempt."""
    monkeypatch.setattr(base, "HANDED_DATA_LIMIT_BYTES", -1)  # workers read the file, as Ray's, Slurm's and large data's do
    path = data_campaign(tmp_path, "mlp: {hidden_size: 8}\n  linear: {}", "retries: 0")
    write_data(tmp_path / "data.csv", series())
    aside = tmp_path / "data.csv.away"
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    prepare = campaign.prepare

    def prepare_then_remove(**kwargs):
        prepared = prepare(**kwargs)
        os.replace(tmp_path / "data.csv", aside)  # the run has read it; its workers will not find it
        return prepared

    campaign.prepare = prepare_then_remove

    finished = threading.Event()

    def restore_once_missed():
        wait_for(lambda: finished.is_set() or store_rows(tmp_path / "work", "SELECT 1 FROM events WHERE kind = 'environment'"),
                 "a trial to miss its data")
        os.replace(aside, tmp_path / "data.csv")

    helper = threading.Thread(target=restore_once_missed)
    helper.start()
    try:
        outcome = campaign.run(executor="inline")
    finally:
        finished.set()
        helper.join(timeout=WAIT_S)
    assert (outcome.done, outcome.failed, outcome.retried, outcome.waiting) == (4, 0, 0, 0) and outcome.environment >= 1
    assert rows(tmp_path / "work", "SELECT DISTINCT status, attempts FROM trials") == [("done", 1)]
    (message, *_), = rows(tmp_path / "work", "SELECT message FROM events WHERE kind = 'environment' ORDER BY event_id LIMIT 1")
    assert message.startswith("not counted as an attempt; retried after a 1 s pause: EnvironmentFailure: the data could not be loaded: ")
    assert "data.csv: source: no such file" in message


def test_a_data_file_missing_past_the_patience_leaves_trials_pending_and_a_plain_rerun_finishes_them(tmp_path, monkeypatch, capsys):
    path = data_campaign(tmp_path, "linear: {}", "retries: 0")
    write_data(tmp_path / "data.csv", series())
    monkeypatch.setattr(environment, "PAUSES_S", (0.1,))
    monkeypatch.setattr(environment, "PATIENCE_S", 1.0)
    monkeypatch.setattr(base, "HANDED_DATA_LIMIT_BYTES", -1)  # workers read the file, as Ray's, Slurm's and large data's do
    prepare = Campaign.prepare

    def prepare_then_remove(self, **kwargs):
        prepared = prepare(self, **kwargs)
        os.replace(tmp_path / "data.csv", tmp_path / "data.csv.away")
        return prepared

    monkeypatch.setattr(Campaign, "prepare", prepare_then_remove)
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("gpufill: 2 trials are left pending because the environment kept failing them (last: EnvironmentFailure: the data could "
                          "not be loaded: ")
    assert err.strip().endswith(f"they used none of their retries: once that is fixed, finish the campaign with: gpufill run {path} --workdir "
                                f"{tmp_path / 'work'}")
    assert rows(tmp_path / "work", "SELECT DISTINCT status, attempts FROM trials") == [("pending", 0)]
    code, out, _err = run_cli(capsys, "status", "--workdir", tmp_path / "work", "--json")
    assert json.loads(out)["run"]["state"] == "incomplete"
    monkeypatch.setattr(Campaign, "prepare", prepare)
    os.replace(tmp_path / "data.csv.away", tmp_path / "data.csv")
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    text = " ".join(out.split())
    assert "2 trials an earlier run left pending after environment failures (not counted as attempts) are run again; the last failure: " \
           "EnvironmentFailure: the data could not be loaded:" in text
    assert "done 2, failed 0, pending 0 of 2 trials" in text
    assert rows(tmp_path / "work", "SELECT DISTINCT status, attempts FROM trials") == [("done", 1)]


@pytest.mark.parametrize("how, status, attempts, kind", [("kill", "done", 1, "environment"), ("segv", "failed", 1, "trial_failed"),
                                                       ("zygote", "done", 1, "environment")])
@pytest.mark.slow
def test_a_worker_killed_from_outside_uses_no_retry_while_a_crash_of_its_own_does(tmp_path, how, status, attempts, kind):
    """"zygote": kill -9 of the lane's zygote, then of the worker it forked: its exit code is lost with the zygote, and
    that is still the environment's doing; the lane goes on with fresh workers."""
    marker = tmp_path / "once"
    path = data_campaign(tmp_path, f"tests.integrity_models:crashes_on_first_try: {{marker: '{marker}', how: {how}}}", "retries: 0, pack_size: 1")
    write_data(tmp_path / "data.csv", {"a": series()["a"]})
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(cpu_slots=2 if how == "zygote" else 1)  # two slots: one thread each, forked
    assert outcome.crashed == 1 and outcome.retried == 0
    assert rows(tmp_path / "work", "SELECT status, attempts FROM trials") == [(status, attempts)]
    (message,), = rows(tmp_path / "work", "SELECT message FROM events WHERE kind = ?", (kind,))
    assert {"kill": "SIGKILL", "segv": "SIGSEGV", "zygote": "zygote was killed"}[how] in message


def test_a_full_disk_in_a_worker_is_the_environments_failure():
    import errno

    def write_checkpoint():
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as error:
            raise RuntimeError("could not save the checkpoint") from error  # a library wrapping it

    outcome = attempt(a_trial(), write_checkpoint)
    assert outcome.ok is False and outcome.environment is True
    assert attempt(a_trial(), lambda: 1 / 0).environment is False  # the trial's own error


# --- class 3: status that does not lie -----------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_schedulers_run_shows_as_interrupted_in_status_and_monitor(tmp_path, capsys):
    gate, pid_file = tmp_path / "gate", tmp_path / "worker.pid"
    path = data_campaign(tmp_path, f"tests.integrity_models:held: {{gate: '{gate}', pid_file: '{pid_file}'}}\n  linear: {{}}", "pack_size: 1")
    write_data(tmp_path / "data.csv", series())
    work = tmp_path / "work"
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(work), "--cpu-slots", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    worker = None
    try:
        worker = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the first trial to start"))
        alive = read_status(work).to_dict()
        assert alive["run"]["state"] == "running" and alive["running"] == 1 and alive["interrupted"] == 0
        assert snapshot(work)["running"] != []
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=WAIT_S)
        counts = read_status(work).to_dict()
        assert (counts["run"]["state"], counts["running"], counts["interrupted"], counts["pending"], counts["done"]) == ("interrupted", 0, 1, 4, 0)
        code, out, err = run_cli(capsys, "status", "--workdir", work)
        assert code == 0, err
        host = counts["run"]["host"]
        assert (f"not running: run 1 (pid {process.pid} on {host}) stopped without finishing: no process holds the workdir lock; 1 trials it was "
                f"running count as pending; resume with: gpufill run {path} --workdir {work}") in " ".join(out.split())
        code, out, _ = run_cli(capsys, "status", "--workdir", work, "--json")
        assert json.loads(out)["run"]["state"] == "interrupted" and json.loads(out)["running"] == 0
        data = snapshot(work)
        assert data["eta_s"] is None and data["running"] == [] and data["trials_per_min"] == 0.0
        console = Console(width=400, record=True)  # wide: the resume command's path stays whole
        console.print(render(data))
        text = " ".join(console.export_text().split())
        assert "study: 0/4 done, 0 failed, not running (last run interrupted)" in text and "ETA" not in text
        assert f"resume with: gpufill run {path} --workdir {work}" in text
    finally:
        gate.write_text("open")  # the orphaned worker finishes its trial, finds no scheduler and exits
        if process.poll() is None:
            process.kill()
            process.wait()
        if worker is not None:
            wait_for(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE, "the orphaned worker to exit")


def test_a_run_is_alive_exactly_while_a_process_holds_the_workdir_lock(tmp_path):
    store = Store.create(tmp_path)
    trials = [Trial(trial_id=f"t{i}", project=f"p{i}", family="linear", kind="classical", params={}, train={}, seed=0, lookback=4, shape="s")
              for i in range(3)]
    store.sync_trials(trials, {"classical": "cpu"})
    store.set_meta({"campaign_name": "held", "campaign_file": "held.yaml"})
    with WorkdirLock(tmp_path, "gpufill run"):
        run_id = store.begin_run("gpufill run")
        store.mark_running(["t0", "t1"], lane="cpu", worker="cpu-1", run_id=run_id)
        counts = read_status(tmp_path).to_dict()
        assert (counts["run"]["state"], counts["running"], counts["pending"]) == ("running", 2, 1)
        assert len(snapshot(tmp_path)["running"]) == 2
    counts = read_status(tmp_path).to_dict()  # released without ending the run: as a killed scheduler leaves it
    assert (counts["run"]["state"], counts["running"], counts["pending"], counts["interrupted"]) == ("interrupted", 0, 3, 2)
    assert counts["lanes"]["cpu"]["running"] == 0 and counts["lanes"]["cpu"]["pending"] == 3
    store.recover_interrupted(run_id)  # a run stopped by a signal returns its trials and says so
    store.end_run(run_id, "interrupted")
    store.close()
    counts = read_status(tmp_path).to_dict()
    assert (counts["run"]["state"], counts["running"], counts["interrupted"], counts["run"]["detail"]) == ("interrupted", 0, 0, "")
    data = snapshot(tmp_path)
    assert data["eta_s"] is None and data["running"] == []


def watch_args(out: Path, *command: str) -> list[str]:
    return ["watch", "--out", str(out), "--interval", "0.25", "--", sys.executable, *command]


def watch_command(out: Path, *command: str) -> list[str]:
    return [sys.executable, "-m", "gpufill", *watch_args(out, *command)]


@pytest.mark.slow
def test_watch_out_reused_after_a_killed_watch_is_refused_and_its_files_kept(tmp_path, capsys):
    out = tmp_path / "recording"
    process = subprocess.Popen(watch_command(out, "-c", "import time; time.sleep(300)"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    children: list[psutil.Process] = []
    try:
        wait_for(lambda: (out / "samples.jsonl").exists() and (out / "samples.jsonl").stat().st_size > 0, "the watch's first samples")
        children = psutil.Process(process.pid).children(recursive=True)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=WAIT_S)
    finally:
        for child in children:  # the watched command, orphaned by the kill
            child.kill()
        if process.poll() is None:
            process.kill()
            process.wait()
    before = (out / "samples.jsonl").read_bytes()
    code, _out, err = run_cli(capsys, *watch_args(out, "-c", "pass"))  # the refusal needs no process of its own: the killed watch was one
    assert code == 2 and err.count("\n") == 1, err
    assert (f"{out}: --out: {out} already holds the files of a watch that did not finish (samples.jsonl): this run's samples would mix "
            "with them; fix: give --out a new folder (or delete that one)") in err
    assert (out / "samples.jsonl").read_bytes() == before and not (out / "watch.json").exists()


@pytest.mark.slow
def test_watch_out_with_a_step_timeline_left_is_refused_and_an_empty_folder_is_used(tmp_path, capsys):
    left = tmp_path / "left"
    left.mkdir()
    (left / "steps-0-4242.jsonl").write_text('{"t0": 0, "t1": 1, "steps": 3}\n')
    code, _out, err = run_cli(capsys, *watch_args(left, "-c", "pass"))  # the watch in this process; the watched command is its own
    assert code == 2 and "already holds the files of a watch that did not finish (steps-0-4242.jsonl)" in err
    assert sorted(p.name for p in left.iterdir()) == ["steps-0-4242.jsonl"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _out, err = run_cli(capsys, *watch_args(empty, "-c", "pass"))
    assert code == 0, err
    assert json.loads((empty / "watch.json").read_text())["exit_code"] == 0
