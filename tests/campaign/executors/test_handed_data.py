"""Workers on this host start from the data the scheduler loaded (executors/base.py: hand_data): they do not read the
file again nor import pandas (about a second a worker), and they train the same numbers as a worker that reads it."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpufill.campaign.executors import make_executor
from gpufill.campaign.executors.base import worker_setup
from gpufill.campaign.policy.messages import Task
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.spec.data_spec import DataSpec
from gpufill.campaign.worker.worker import TrialRunner
from gpufill.forecasting.data.project import Project

SERIES = 3


def _csv_campaign(tmp_path: Path) -> Path:
    """Three monthly series in one CSV with a date column, one small network (global mode: one trial)."""
    rng = np.random.default_rng(0)
    months = [f"{2000 + m // 12}-{m % 12 + 1:02d}-01" for m in range(72)]
    rows = ["series,date,y"] + [f"s{s},{month},{100 + 10 * s + 5 * np.sin(m / 12 * 2 * np.pi) + rng.normal():.4f}"
                                for s in range(SERIES) for m, month in enumerate(months)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "campaign.yaml"
    path.write_text("name: handed\n"
                    "data: {source: data.csv, target: y, project_column: series}\n"
                    "task: {lookback: [12], horizon: 6, split: {val: 6, test: 6}, mode: global}\n"
                    "models:\n  mlp: {hidden_size: 8}\n"
                    "train: {epochs: 2, early_stopping: null}\n"
                    "seeds: [0]\nresources: {retries: 0}\n")
    return path


def _result(outcome):  # noqa: ANN001, ANN202 - a trial's test metrics, to compare bit for bit
    assert outcome.ok, outcome.error
    return outcome.result.metrics["test"]


def test_a_loaded_project_carries_its_season_and_one_built_in_code_finds_it_when_asked(tmp_path):
    campaign = Campaign.from_yaml(_csv_campaign(tmp_path), tmp_path / "work")
    projects = campaign.spec.data.load(tmp_path)
    assert sorted(projects) == ["s0", "s1", "s2"] and {p.season for p in projects.values()} == {12}
    built = Project(name="p", target=np.arange(30.0), covariates=np.zeros((30, 0)), covariate_names=(), source="synthetic")
    assert built.season is None and built.season_length() == 7


def test_the_runner_hands_the_scheduler_s_projects_to_the_executor_and_its_runners_never_read_the_file(tmp_path, monkeypatch):
    path = _csv_campaign(tmp_path)
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    executor = make_executor("inline", spec=campaign.spec, base_dir=str(tmp_path), workdir=tmp_path / "work")
    prepared = campaign.prepare(executor=executor)
    assert executor.data is not None and sorted(executor.data) == ["s0", "s1", "s2"]
    reader = TrialRunner(campaign.spec.model_dump(mode="json"), tmp_path, threads=1, device="cpu")
    read = _result(reader.run_task(Task(tuple(prepared.trials))).outcomes[0])

    def refuse(self, base_dir, *, where=None):  # noqa: ANN001, ANN202
        raise AssertionError("a worker handed the data read the file")

    monkeypatch.setattr(DataSpec, "load", refuse)
    executor.start(prepared.lanes)
    handed = executor.runners[prepared.lanes[0].name]
    assert sorted(handed.projects()) == sorted(executor.data) and all(handed.projects()[k] is executor.data[k] for k in executor.data)
    assert _result(handed.run_task(Task(tuple(prepared.trials))).outcomes[0]) == read  # bit for bit
    executor.shutdown()


@pytest.mark.slow
def test_a_worker_started_from_handed_data_trains_without_importing_pandas(tmp_path):
    path = _csv_campaign(tmp_path)
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    prepared = campaign.prepare()
    projects = campaign.spec.data.load(tmp_path)
    setup = worker_setup(campaign.spec.model_dump(mode="json"), str(tmp_path), threads=1, device="cpu", data=projects)
    (tmp_path / "start.pkl").write_bytes(pickle.dumps((setup, Task(tuple(prepared.trials)))))
    code = ("import json, pickle, sys\n"
            "from gpufill.campaign.worker.worker import start_runner\n"
            f"setup, task = pickle.loads(open({str(tmp_path / 'start.pkl')!r}, 'rb').read())\n"
            "outcome = start_runner(setup).run_task(task).outcomes[0]\n"
            "print(json.dumps({'ok': outcome.ok, 'error': outcome.error, 'pandas': 'pandas' in sys.modules,\n"
            "                  'test': outcome.result.metrics['test'] if outcome.ok else None}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["ok"], answer["error"]
    assert answer["pandas"] is False
    reader = TrialRunner(campaign.spec.model_dump(mode="json"), tmp_path, threads=1, device="cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker's lane of one thread
    try:
        read = _result(reader.run_task(Task(tuple(prepared.trials))).outcomes[0])
    finally:
        torch.set_num_threads(before)
    assert answer["test"] == read  # bit for bit
