"""Inline, Ray and Slurm executors: the local executor's trials and metrics, crashes retried, resume after kill -9, job status, missing packages."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from gpufill.campaign.executors import LaneRequest, make_executor
from gpufill.campaign.executors.slurm import SlurmExecutor
from gpufill.campaign.run.runner import Campaign, read_jobs, read_results, read_status
from gpufill.campaign.spec.spec import SlurmSpec, load_campaign
from gpufill.campaign.store.store import Store
from tests.helpers import run_cli, write_campaign
from tests.shared_runs import shared_folder

ray = pytest.importorskip("ray")  # imported at collection: its import sets RAY_CLIENT_MODE once, before any test
submitit = pytest.importorskip("submitit")

METRICS = ["mae", "rmse", "smape", "mase"]
SHARED_MODELS = "mlp: {hidden_size: [8, 16]}\n  linear: {}"


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module (its start costs seconds); executors use it as they find it."""
    saved = dict(os.environ)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)  # ray.init sets RAY_* and PYTHONBREAKPOINT


def shared_campaign(folder: Path) -> Path:
    """SHARED_MODELS on 2 projects with packs of 2 pinned: `auto` measures the size by timing, and another size sums in
    another order (metrics 1e-9 apart), so only a pinned size makes two runs comparable bit for bit. The pack size is
    not part of a trial's id."""
    path = write_campaign(folder, models=SHARED_MODELS)
    path.write_text(path.read_text().replace("resources: {retries: 1}", "resources: {retries: 1, pack_size: 2}"))
    return path


def _run_locally(folder: Path) -> None:
    assert Campaign.from_yaml(shared_campaign(folder), folder / "work").run().done == 6  # 2 projects x (2 mlp + linear)


@pytest.fixture
def local_results(tmp_path_factory):
    """The shared campaign through local worker processes, run once per session (tests/shared_runs.py): the reference
    for the other executors."""
    return read_results(shared_folder(tmp_path_factory, "executors-local", _run_locally) / "work").set_index("trial_id")


def _assert_same_results(results, reference):
    results = results.set_index("trial_id")
    assert sorted(results.index) == sorted(reference.index)  # the same trial ids: the same store, resumable by either
    assert (results["status"] == "done").all() and (results["attempts"] == 1).all()
    # Bit for bit, networks included: the same seeds, threads and precision (fixed on a CPU), the pack size pinned, and a
    # member's numbers do not depend on the pack it trains in (a lone one trains as a pack of one).
    assert results.loc[reference.index, METRICS].equals(reference[METRICS])


@pytest.mark.slow
def test_ray_runs_the_local_executor_s_trials_with_the_same_metrics(tmp_path, ray_session, local_results):
    campaign = Campaign.from_yaml(shared_campaign(tmp_path), tmp_path / "work")
    outcome = campaign.run(executor="ray")
    assert (outcome.done, outcome.failed, outcome.crashed) == (6, 0, 0)
    _assert_same_results(campaign.results(), local_results)
    assert campaign.run(executor="ray").done == 0  # a re-run resumes: nothing left
    assert ray.is_initialized()  # a Ray it found running is left running


@pytest.mark.slow
def test_inline_runs_the_local_executor_s_trials_bit_for_bit_and_starts_no_process(tmp_path, local_results):
    campaign = Campaign.from_yaml(shared_campaign(tmp_path), tmp_path / "work")
    before = {child.pid for child in psutil.Process().children(recursive=True)}  # an earlier test's may still be ending
    outcome = campaign.run(executor="inline")
    assert (outcome.done, outcome.failed, outcome.crashed) == (6, 0, 0)
    assert {child.pid for child in psutil.Process().children(recursive=True)} - before == set()  # no worker, no zygote
    results = campaign.results().set_index("trial_id")
    assert sorted(results.index) == sorted(local_results.index) and (results["attempts"] == 1).all()
    # The same lanes, threads, seeds and packs in one process: every metric equal, neural trials included.
    assert results.loc[local_results.index, METRICS].equals(local_results[METRICS])
    assert campaign.run(executor="inline").done == 0  # a re-run resumes: nothing left


@pytest.mark.slow
def test_a_ray_actor_killed_mid_trial_is_replaced_and_its_trial_run_again_without_spending_an_attempt(tmp_path, ray_session):
    marker = tmp_path / "killed-once"
    models = f"tests.campaign_models:killed_on_first_try: {{marker: '{marker}'}}\n  linear: {{}}"
    campaign = Campaign.from_yaml(write_campaign(tmp_path, models=models, projects=1, retries=1), tmp_path / "work")
    outcome = campaign.run(executor="ray")
    assert (outcome.crashed, outcome.retried, outcome.failed, outcome.done, outcome.environment) == (1, 0, 0, 2, 1)
    results = campaign.results().set_index("family")
    assert results.loc["tests.campaign_models:killed_on_first_try", "attempts"] == 1  # killed from outside: no attempt spent
    assert (results["status"] == "done").all()
    crashes = _events(tmp_path / "work", "worker_crashed")
    assert len(crashes) == 1 and "Ray actor died" in crashes[0]


@pytest.mark.slow
def test_kill_9_of_the_scheduler_during_a_ray_run_loses_nothing_and_records_nothing_twice(tmp_path):
    path = write_campaign(tmp_path, projects=4, epochs=40, models="mlp: {hidden_size: [16, 32]}\n  linear: {}")
    # One trial per task: fused packs would finish four at a time, and the run could end between two looks.
    path.write_text(path.read_text().replace("resources: {retries: 1}", "resources: {retries: 1, pack_size: 1}"))
    workdir = tmp_path / "work"
    command = [sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(workdir), "--executor", "ray"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        done_before = _wait_for_done(workdir / "gpufill.db", at_least=2, timeout=180)
        os.kill(process.pid, signal.SIGKILL)  # the scheduler only: its Ray goes with it
        process.wait(timeout=240)  # sized for a loaded box: only a hang reaches it
    finally:
        _kill_group(process.pid)  # what Ray leaves of its own (agents) after its driver dies
    total = 4 * 3
    assert len(done_before) >= 2, "the first run finished no trials in time"
    assert read_status(workdir).to_dict()["done"] < total, "the run finished before it could be killed"

    rerun = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "done 12, failed 0" in rerun.stdout  # the CLI's own account, from --executor ray
    results = read_results(workdir)
    assert len(results) == total and results["trial_id"].is_unique and (results["status"] == "done").all()
    after = dict(zip(results["trial_id"], results["mae"], strict=True))
    assert all(after[tid] == mae for tid, mae in done_before.items())  # finished results unchanged
    assert (results[results["trial_id"].isin(done_before)]["attempts"] == 1).all()  # and never run again


@pytest.mark.slow
def test_slurm_jobs_through_submitit_s_local_cluster_match_the_local_executor(tmp_path, capsys, local_results):
    path = shared_campaign(tmp_path)
    _add_slurm(path, "{cluster: local, gpus_per_job: 0, timeout_min: 10}")
    workdir = tmp_path / "work"
    seen: dict[str, object] = {}

    def watch(_snapshot) -> None:  # what `gpufill status` shows while jobs run
        if "status" not in seen and read_jobs(workdir):
            seen["status"] = run_cli(capsys, "status", "--workdir", workdir, "--json")
            seen["table"] = run_cli(capsys, "status", "--workdir", workdir)

    campaign = Campaign.from_yaml(path, workdir)
    outcome = campaign.run(executor="slurm", on_update=watch)
    assert (outcome.done, outcome.failed, outcome.crashed) == (6, 0, 0)
    _assert_same_results(campaign.results(), local_results)
    code, out, _ = seen["status"]
    listed = json.loads(out)["jobs"]
    assert code == 0 and listed and all(job["state"] in ("queued", "running") and job["lane"] == "cpu" for job in listed)
    assert f"Slurm jobs {listed[0]['state']}: " in seen["table"][1] and listed[0]["job_id"] in seen["table"][1]
    jobs = _jobs(workdir)  # every trial went out in a job recorded as done; a pack is one job
    assert all(state == "done" for _, state, _ in jobs) and max(len(ids) for _, _, ids in jobs) == 2
    # (a pack sent to measure its size may hand trials back unstarted: they go out again in another job)
    assert {tid for _, _, ids in jobs for tid in ids} == set(local_results.index)
    assert (workdir / "slurm").is_dir()
    assert read_jobs(workdir) == []  # none queued or running once the run is over


@pytest.mark.slow
def test_a_failed_slurm_job_is_resubmitted(tmp_path):
    marker = tmp_path / "killed-once"
    path = write_campaign(tmp_path, models=f"tests.campaign_models:killed_on_first_try: {{marker: '{marker}'}}", projects=1, retries=1)
    _add_slurm(path, "{cluster: local, gpus_per_job: 0}")
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    outcome = campaign.run(executor="slurm")
    assert (outcome.crashed, outcome.retried, outcome.failed, outcome.done) == (1, 1, 0, 1)
    result = campaign.results().iloc[0]
    assert result["status"] == "done" and result["attempts"] == 2
    jobs = _jobs(tmp_path / "work")
    assert [state for _, state, _ in jobs] == ["failed", "done"] and jobs[0][2] == jobs[1][2] == [result["trial_id"]]
    crashes = _events(tmp_path / "work", "worker_crashed")
    assert len(crashes) == 1 and f"Slurm job {jobs[0][0]} ended without a result" in crashes[0]


@pytest.mark.parametrize(("module", "executor", "extra"), [("ray", "ray", "ray"), ("submitit", "slurm", "slurm")])
def test_a_missing_optional_package_is_one_line_with_the_install_command(tmp_path, capsys, monkeypatch, module, executor, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import ray` now raises ImportError
    code, _, err = run_cli(capsys, "run", write_campaign(tmp_path, models="linear: {}"), "--workdir", tmp_path / "work", "--executor", executor)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"pip install 'gpufill[{extra}]'" in lines[0] and "--executor" in lines[0]
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("args", "slurm", "must_mention"),
    [
        (["--executor", "dask"], None, ["--executor", "unknown executor 'dask'", "local, inline, ray, slurm"]),
        (["--address", "auto"], None, ["--address", "--executor ray"]),
        (["--executor", "slurm"], "{partition: gpu}", ["sbatch", "resources.slurm.cluster", "cluster: local"]),
        (["--executor", "slurm"], "{gpus_per_job: 2}", ["tiny.yaml:10", "resources.slurm.gpus_per_job", "<= 1"]),
        (["--executor", "slurm"], "{sbatch: {Account: x}}", ["tiny.yaml:10", "resources.slurm.sbatch.Account", "without dashes"]),
    ],
)
def test_bad_executor_settings_exit_2_before_anything_runs(tmp_path, capsys, monkeypatch, args, slurm, must_mention):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here, whatever the machine has
    path = write_campaign(tmp_path, models="linear: {}")
    if slurm is not None:
        _add_slurm(path, slurm)
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    for text in must_mention:
        assert text in lines[0], (text, lines[0])
    assert not (tmp_path / "work").exists()


def test_resources_slurm_from_the_docs_become_the_jobs_sbatch_lines(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"  # stand-ins: submitit checks for srun, gpufill for sbatch; nothing is submitted
    bin_dir.mkdir()
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    page = (Path(__file__).parents[3] / "docs" / "scale-out.md").read_text()  # the Slurm settings as the docs show them
    block = page.split("## Slurm")[1].split("```yaml\n")[1].split("```")[0]
    path = tmp_path / "readme.yaml"
    path.write_text("name: readme\ndata: {source: synthetic, projects: 1, length: 300}\ntask: {lookback: [12]}\nmodels: {mlp: {hidden_size: 8}, linear: {}}\n" + block)
    spec = load_campaign(path)
    assert spec.resources.retries == 2 and spec.resources.slurm.cluster == "slurm"
    executor = make_executor("slurm", spec=spec, base_dir=str(tmp_path), workdir=tmp_path / "work")
    lanes, warnings = executor.plan(LaneRequest(kinds=frozenset({"neural", "classical"}), gpu_slots="auto", cpu_slots=3,
                                                threads_per_trial="auto", memory_margin=0.85, where=str(path)))
    assert warnings == []
    shape = {lane.name: (lane.slots, lane.threads, lane.device, lane.kinds, lane.memory_budget_bytes) for lane in lanes}
    assert shape == {"gpu": (32, 4, "cuda:0", ("neural",), None), "cpu": (3, 4, "cpu", ("classical",), None)}  # max_jobs; --cpu-slots 3
    executor.start(lanes)
    scripts = {name: ex._executor._make_submission_file_text("python -m submitit.core._submit F", "uid") for name, ex in executor._executors.items()}
    for name, script in scripts.items():
        for line in ("--partition=gpu", "--time=120", "--cpus-per-task=4", "--mem=16GB", "--account=proj42", "--qos=normal", f"--job-name=gpufill-readme-{name}"):
            assert f"#SBATCH {line}\n" in script, (name, line)
        assert "export OMP_NUM_THREADS=4\nexport MKL_NUM_THREADS=4" in script  # before the job's Python starts
    assert "#SBATCH --gpus-per-node=1\n" in scripts["gpu"] and "--gpus-per-node" not in scripts["cpu"]
    executor.shutdown()


@pytest.mark.slow
def test_jobs_a_killed_run_left_queued_or_running_are_marked_failed_and_cancelled(tmp_path, monkeypatch):
    calls = tmp_path / "scancel-calls"
    (tmp_path / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (tmp_path / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    store = Store.create(tmp_path)
    try:
        store.record_jobs(1, [{"job_id": f"77_{i}", "lane": "gpu", "worker": f"gpu-{i}", "trial_ids": [f"t{i}"], "state": state, "detail": state.upper()}
                              for i, state in enumerate(("queued", "running", "done"))])
        assert store.orphan_jobs(2) == ["77_0", "77_1"]  # the done one is left alone
        assert [(j["job_id"], j["state"], j["detail"]) for j in store.jobs()] == [
            ("77_0", "failed", "orphaned: its scheduler stopped"), ("77_1", "failed", "orphaned: its scheduler stopped"), ("77_2", "done", "DONE")]
        assert store.orphan_jobs(3) == []
    finally:
        store.close()
    executor = SlurmExecutor(spec_payload={}, base_dir=str(tmp_path), folder=tmp_path / "slurm", settings=SlurmSpec(), name="x")
    executor.cancel_jobs(["77_0", "77_1"])
    assert calls.read_text() == "77_0 77_1\n"


# -- helpers ------------------------------------------------------------------------------


def _add_slurm(path: Path, settings: str) -> None:
    """resources: {retries: N} -> a block with a slurm section (at line 10 of a one-family campaign)."""
    text = path.read_text()
    inside = text.split("resources: {")[1].split("}")[0]  # retries, and a pinned pack_size where there is one
    block = "".join(f"  {item.strip()}\n" for item in inside.split(","))
    path.write_text(text.replace(f"resources: {{{inside}}}", f"resources:\n{block}  slurm: {settings}"))


def _wait_for_done(db: Path, *, at_least: int, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    done: dict[str, float] = {}
    while time.monotonic() < deadline and len(done) < at_least:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    done = dict(con.execute("SELECT trial_id, mae FROM trials WHERE status = 'done'").fetchall())
            except sqlite3.OperationalError:
                pass
        time.sleep(0.1)
    return done


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _events(workdir: Path, kind: str) -> list[str]:
    with sqlite3.connect(workdir / "gpufill.db") as con:
        return [row[0] for row in con.execute("SELECT message FROM events WHERE kind = ?", (kind,))]


def _jobs(workdir: Path) -> list[tuple[str, str, list[str]]]:
    with sqlite3.connect(workdir / "gpufill.db") as con:
        rows = con.execute("SELECT job_id, state, trial_ids FROM jobs ORDER BY submitted_at, job_id").fetchall()
    return [(job_id, state, json.loads(ids)) for job_id, state, ids in rows]
