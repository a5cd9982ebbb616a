"""The scheduler never imports torch (its workers do), and still refuses a grid value that only building a model
proves wrong: at its line, before anything is written, from a child process (or here, when the child cannot answer)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from gpufill.campaign.executors.forked import FRESH_WORKERS_VARIABLE
from gpufill.campaign.spec import build_check
from tests.helpers import run_cli, write_campaign

# `gpufill run` as the console script runs it, reporting at exit which heavy libraries the scheduler's process loaded.
SCHEDULER = """
import atexit, json, runpy, sys
atexit.register(lambda: print("LOADED " + json.dumps(sorted(m for m in ("torch", "pandas", "sklearn", "scipy") if m in sys.modules))))
sys.argv = ["gpufill", *sys.argv[1:]]
runpy.run_module("gpufill", run_name="__main__")
"""


@pytest.mark.slow  # an interpreter, its zygote, a build check and a campaign
def test_a_gpufill_run_s_scheduler_never_imports_torch_while_its_workers_train(tmp_path):
    path = write_campaign(tmp_path, models="mlp: {hidden_size: [8, 16]}\n  linear: {}", projects=2, epochs=2)
    done = subprocess.run([sys.executable, "-c", SCHEDULER, "run", str(path), "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.rsplit("LOADED ", 1)[1].splitlines()[0])
    assert loaded == []  # no torch, and none of what the data and the classical families need either
    with sqlite3.connect(tmp_path / "w" / "gpufill.db") as db:
        rows = db.execute("SELECT family, status, mae FROM trials").fetchall()
    assert len(rows) == 6 and {family for family, _, _ in rows} == {"mlp", "linear"}  # 2 projects x (2 mlp + 1 linear)
    assert all(status == "done" and mae is not None and mae > 0 for _, status, mae in rows)  # trained in the workers, with torch


BAD_HEADS = "transformer: {d_model: [32, 30], nhead: 4}"
"""d_model 30 is not a multiple of 4 heads: only building the model says so."""


@pytest.mark.slow  # the build check's child imports torch
def test_a_value_only_a_build_proves_wrong_is_refused_at_its_line_before_anything_is_written(tmp_path, capsys):
    path = write_campaign(tmp_path, models=BAD_HEADS)
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "w")
    assert code == 2
    assert f"{path}:5: models.transformer.d_model: transformer with {{'d_model': 30, 'nhead': 4}}: d_model (30) must be divisible by nhead (4)" in err
    assert not (tmp_path / "w").exists()


def test_a_build_check_child_that_cannot_answer_is_replaced_by_building_in_the_scheduler(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(FRESH_WORKERS_VARIABLE, "1")  # no zygote: the check starts a child of its own
    started: list[list[str]] = []
    real_popen = build_check.subprocess.Popen

    def broken_child(command, **kwargs):  # the check's child dies at once, as a killed or broken interpreter would
        if command[2] != "gpufill.campaign.spec.build_check":
            return real_popen(command, **kwargs)
        started.append(command)
        return real_popen([sys.executable, "-c", "raise SystemExit(3)"], **kwargs)

    monkeypatch.setattr(build_check.subprocess, "Popen", broken_child)
    monkeypatch.setattr(build_check, "wanted", lambda: True)  # as in a `gpufill run` process, which has no torch
    path = write_campaign(tmp_path, models=BAD_HEADS)
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "w")
    assert len(started) == 1
    assert code == 2 and f"{path}:5: models.transformer.d_model:" in err and "must be divisible by nhead (4)" in err
    assert not (tmp_path / "w").exists()


class Gone:
    """A zygote that died before its check child answered."""

    def poll(self) -> int:
        return -9


def test_the_zygote_builds_the_grid_points_and_one_that_dies_first_is_replaced_by_building_in_the_scheduler(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(build_check, "wanted", lambda: True)
    handed: list[object] = []
    real = build_check.BuildCheck.answered_by
    monkeypatch.setattr(build_check.BuildCheck, "answered_by", lambda self, helper: (handed.append(helper), real(self, helper))[1])
    path = write_campaign(tmp_path, models=BAD_HEADS)
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "w")  # the lane's zygote answers: the same line
    assert len(handed) == 1 and code == 2 and f"{path}:5: models.transformer.d_model:" in err and "must be divisible by nhead (4)" in err
    monkeypatch.setattr(build_check.BuildCheck, "answered_by", lambda self, helper: real(self, Gone()))
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "w")
    assert code == 2 and f"{path}:5: models.transformer.d_model:" in err and "must be divisible by nhead (4)" in err
    assert not (tmp_path / "w").exists()


def test_a_loss_a_grid_point_cannot_give_is_refused_at_its_line_by_the_deferred_build(tmp_path, capsys, monkeypatch):
    """N-BEATS' interpretable stacks span the horizon's steps: `loss: quantile` (5 outputs a step) is refused at the
    file's train.loss line by the build check the scheduler defers, not by every trial failing later."""
    monkeypatch.setattr(build_check, "wanted", lambda: True)  # as in a `gpufill run` process, which has no torch
    path = write_campaign(tmp_path, models="nbeats: {stacks: interpretable, blocks: 2, width: 16}")
    path.write_text(path.read_text().replace("early_stopping: null}", "early_stopping: null, loss: quantile}"))
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "w")
    assert code == 2 and err.count("\n") == 1, err
    assert f"{path}:6: train.loss: nbeats with {{'stacks': 'interpretable', 'blocks': 2, 'width': 16}}: nbeats's forecast is a basis" in err
    assert "fix: use a loss of one output per step" in err and not (tmp_path / "w").exists()


def test_builds_are_deferred_only_inside_deferred_and_every_point_is_listed(tmp_path):
    with build_check.deferred() as builds:
        build_check.check_or_defer("mlp", {"hidden_size": [8, 16], "lr": [1e-3]}, lookback=12, horizon=2)
    assert builds == [{"family": "mlp", "axes": {"hidden_size": [8, 16], "lr": [1e-3]}, "lookback": 12, "horizon": 2, "outputs_per_step": [1]}]
    assert build_check.BuildCheck.prepare([], "c.yaml", {}) is None  # nothing to build: no child

