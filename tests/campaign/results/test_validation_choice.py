"""Choosing without peeking (issue 38 items 3, 5, 6): every family, classical and statistical included, is scored on
the validation window; `--best`, the summary and the report choose on it; deterministic references run once whatever
the seeds; a global campaign's declared ensemble is one pooled row; short series are one note; off a terminal no
column of a results table is cut."""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.results.ensembles import read_declared
from gpufill.campaign.results.reading import read_best, read_trials, winners
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store
from tests.helpers import run_cli

DISAGREE = """name: disagree
data: {source: synthetic, projects: 6, length: 120, seed: 3}
task: {lookback: [24], horizon: 12, split: {val: 12, test: 12}}
models:
  linear: {}
  snaive: {season_length: 12}
  theta: {season_length: 12}
seeds: [0, 1, 2]
resources: {retries: 0}
"""


@pytest.fixture(scope="module")
def disagree(tmp_path_factory):
    """Six synthetic projects on which, for 4 of them, the family best on validation is not the one best on test."""
    folder = tmp_path_factory.mktemp("disagree")
    (folder / "c.yaml").write_text(DISAGREE)
    outcome = Campaign.from_yaml(folder / "c.yaml", folder / "work").run(executor="inline")
    return folder / "work", outcome


def test_references_run_once_per_project_whatever_the_seeds(disagree):
    workdir, outcome = disagree
    assert (outcome.done, outcome.failed) == (6 * (3 + 1 + 1), 0)  # linear: 3 seeds; snaive, theta: one each
    trials = read_trials(workdir)
    seeds = trials.groupby("family")["seed"].agg(lambda s: sorted(set(s)))
    assert seeds.to_dict() == {"linear": [0, 1, 2], "snaive": [0], "theta": [0]}
    assert trials.groupby(["project", "family"]).size().to_dict() == {(f"p{i:03d}", f): n for i in range(6) for f, n in
                                                                       (("linear", 3), ("snaive", 1), ("theta", 1))}


def test_classical_and_statistical_families_carry_validation_scores(disagree):
    trials = read_trials(disagree[0])
    for metric in ("mae", "rmse", "smape", "mase"):
        assert trials[f"val_{metric}"].notna().all(), metric
    # Scored on other windows than the test: the two scores differ on every trial.
    assert (trials["val_mae"] != trials["mae"]).all()


def test_best_chooses_on_validation_never_on_the_test_window(disagree, capsys):
    workdir = disagree[0]
    per_family = read_best(workdir)
    chosen = {row["project"]: row for row in winners(per_family)}
    peeked = 0
    for project, rows in pd.DataFrame(per_family).groupby("project"):
        by_val = rows.loc[rows["val_mae"].idxmin()]
        by_test = rows.loc[rows["mae"].idxmin()]
        assert chosen[project]["family"] == by_val["family"] and chosen[project]["chosen_on"] == "val"
        assert chosen[project]["mae"] == pytest.approx(by_val["mae"])  # the test score shown is the chosen one's
        peeked += by_test["family"] != by_val["family"]
    assert peeked >= 2  # the data set makes the two choices differ: choosing on test would pick other families
    code, out, _ = run_cli(capsys, "results", "--best", "--format", "json", "--workdir", workdir)
    assert code == 0 and {row["project"]: row["family"] for row in json.loads(out)} == {p: r["family"] for p, r in chosen.items()}
    code, out, _ = run_cli(capsys, "results", "--best", "--workdir", workdir)
    assert code == 0 and "ranked on the validation window" in " ".join(out.split())
    code, out, _ = run_cli(capsys, "results", "--summary", "--format", "csv", "--workdir", workdir)
    summary = pd.read_csv(io.StringIO(out))
    assert summary["val_mae"].notna().all() and set(summary["chosen_on"]) == {"val"} and len(summary) == 18


def test_the_report_shows_the_choice_made_on_validation(disagree):
    from gpufill.report.html import write_report

    workdir = disagree[0]
    html = write_report(workdir, workdir.parent / "report.html").read_text()
    best = html[html.index("<h3>Best configuration per project</h3>"):]
    best = best[: best.index("</table>")]
    assert "validation MAE" in best and best.count(">val<") == 6
    for row in winners(read_best(workdir)):
        assert f">{row['family']}<" in best


POOLED = """name: pooled
data: {source: synthetic, projects: 4, length: 150, seed: 2}
task: {lookback: [12], horizon: 6, split: {val: 6, test: 6}, mode: global}
models:
  mlp: {hidden_size: 8}
  linear: {}
  snaive: {season_length: 7}
ensemble: {families: [mlp, linear], within: null}
train: {epochs: 2, early_stopping: null}
seeds: [0, 1]
resources: {retries: 0}
"""


def test_a_global_campaigns_declared_ensemble_is_one_pooled_row_in_table_csv_and_json(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(POOLED)
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "w").run(executor="inline")
    assert (outcome.done, outcome.failed) == (2 + 2 + 1, 0)
    store = Store.open(tmp_path / "w")
    try:
        per_project = read_declared(store)
    finally:
        store.close()
    assert len(per_project) == 4  # kept per project; the summary pools them as a global family's row is pooled
    pooled_mae = statistics.fmean(row["mae"] for row in per_project)
    rows = read_best(tmp_path / "w")
    ensemble = [row for row in rows if row["family"].startswith("ensemble (")]
    snaive = next(row for row in rows if row["family"] == "snaive")
    assert [row["project"] for row in rows] == ["*"] * 4 and len(ensemble) == 1
    assert ensemble[0]["mae"] == pytest.approx(pooled_mae, rel=1e-12) and ensemble[0]["seeds"] == 4  # 2 families x 2 seeds
    assert ensemble[0]["vs_snaive"] == pytest.approx(pooled_mae / snaive["mae"], rel=1e-12)
    for fmt in ("csv", "json"):
        code, out, _ = run_cli(capsys, "results", "--summary", "--format", fmt, "--workdir", tmp_path / "w")
        frame = pd.read_csv(io.StringIO(out)) if fmt == "csv" else pd.DataFrame(json.loads(out))
        row = frame[frame["family"].str.startswith("ensemble (")]
        assert code == 0 and len(row) == 1 and row["mae"].iloc[0] == pytest.approx(pooled_mae, rel=1e-9), fmt
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", tmp_path / "w")
    assert code == 0 and sum(line.lstrip().startswith("*") for line in out.splitlines()) == 4


def test_short_series_are_one_note_with_the_count_and_the_shortest(tmp_path):
    rng = np.random.default_rng(0)
    lengths = {"long": 200, "a": 45, "b": 41, "c": 50}
    pd.concat([pd.DataFrame({"store": name, "y": 50 + np.sin(np.arange(n) / 2) * 5 + rng.normal(0, 1, n)}) for name, n in lengths.items()]).to_csv(
        tmp_path / "sales.csv", index=False)
    (tmp_path / "c.yaml").write_text("name: padded\ndata: {source: sales.csv, target: y, project_column: store}\n"
                                     "task: {lookback: [40], horizon: 2, mode: global, split: {val: 0.1, test: 0.2}}\n"
                                     "models: {linear: {}}\nseeds: [0]\n")
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "w").run(executor="inline")
    assert (outcome.done, outcome.failed) == (1, 0)
    store = Store.open(tmp_path / "w")
    try:
        notes = [e["message"] for e in store.events() if "left-padded" in e["message"]]
    finally:
        store.close()
    assert len(notes) == 1 and notes[0].startswith("3 projects are left-padded at lookback 40 (the shortest: b, length 41)")


def test_results_off_a_terminal_cut_no_column(disagree):
    out = subprocess.run([sys.executable, "-m", "gpufill", "results", "--workdir", str(disagree[0])], capture_output=True, text=True,
                         check=True, env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}).stdout
    header = next(line for line in out.splitlines() if line.startswith("id"))
    assert header.split() == ["id", "project", "family", "params", "train", "seed", "lb", "status", "try", "lane", "secs", "mae", "rmse",
                              "smape", "mase"]
    first = next(line for line in out.splitlines() if line.startswith(tuple("0123456789abcdef")) and "p000" in line)
    assert "p000" in first.split() and first.split()[2] in ("linear", "snaive", "theta")
