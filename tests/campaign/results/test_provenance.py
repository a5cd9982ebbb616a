"""Provenance: a project's data is part of its trials' identity, results show the campaign file as it is now
(older trials kept, shown with --all and what differs), and every row carries its effective train settings."""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import closing

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.store.store import Store
from tests.helpers import run_cli


def write_data(directory, name: str, scale: float = 1.0) -> None:
    t = np.arange(240)
    rng = np.random.default_rng(len(name))
    pd.DataFrame({"time": t, "target": scale * (np.sin(t / 6) + 0.1 * rng.standard_normal(len(t)))}).to_csv(directory / f"{name}.csv", index=False)


def write_file(tmp_path, *, epochs: int = 2, hidden: str = "[8, 16]", seeds: str = "[0, 1]"):
    path = tmp_path / "study.yaml"
    path.write_text("name: study\ndata: {source: data}\ntask: {lookback: [12], horizon: 1}\n"
                    f"models:\n  mlp: {{hidden_size: {hidden}}}\ntrain: {{epochs: {epochs}, early_stopping: null}}\nseeds: {seeds}\n"
                    "resources: {retries: 0}\n")
    return path


def rows(workdir, query):
    with closing(sqlite3.connect(workdir / "gpufill.db")) as con:
        return con.execute(query).fetchall()


def results(capsys, workdir, *flags) -> pd.DataFrame:
    code, out, err = run_cli(capsys, "results", "--workdir", workdir, "--format", "csv", *flags)
    assert code == 0, err
    return pd.read_csv(io.StringIO(out))


def test_edited_data_reruns_only_its_projects_trials_and_the_summary_shows_only_new_values(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_data(tmp_path / "data", "a")
    write_data(tmp_path / "data", "b")
    path, work = write_file(tmp_path), tmp_path / "work"
    assert run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")[0] == 0
    before = results(capsys, work).set_index("trial_id")
    assert len(before) == 8  # 2 projects x 2 sizes x 2 seeds
    write_data(tmp_path / "data", "b", scale=1000.0)  # b's values change; a's file is untouched
    assert run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")[0] == 0
    after = results(capsys, work).set_index("trial_id")
    kept = after[after.project == "a"]
    assert set(kept.index) == set(before[before.project == "a"].index)  # a's trials: same ids, not re-run
    assert rows(work, "SELECT COUNT(*) FROM trials WHERE project = 'a' AND run_id = 2") == [(0,)]
    new_b = after[after.project == "b"]
    assert len(new_b) == 4 and not set(new_b.index) & set(before.index)  # b's 4 trials re-ran under new ids
    assert new_b["mae"].min() > 50 * before[before.project == "b"]["mae"].max()  # on the new (x1000) values
    summary = results(capsys, work, "--summary").set_index("project")
    assert summary.loc["b", "seeds"] == 2  # the 2 seeds of the file, not 4
    best_b = new_b.assign(size=new_b.params.map(lambda p: json.loads(p)["hidden_size"])).groupby("size")["mae"].mean().min()
    assert summary.loc["b", "mae"] == pytest.approx(best_b, rel=1e-12)  # the mean of the new trials alone (SQLite averages)
    everything = results(capsys, work, "--all")
    stale = everything[everything.stale]
    assert len(stale) == 4 and set(stale.project) == {"b"}
    assert set(stale.differs) == {"data of b changed"}
    assert (everything[~everything.stale].differs.fillna("") == "").all()


def test_edited_settings_leave_the_old_trials_stale_and_never_average_them(tmp_path, capsys, monkeypatch):
    (tmp_path / "data").mkdir()
    write_data(tmp_path / "data", "a")
    path, work = write_file(tmp_path, epochs=2), tmp_path / "work"
    assert run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")[0] == 0
    write_file(tmp_path, epochs=3, hidden="[8]")  # more epochs; the grid value 16 removed
    code, out, _err = run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")
    assert code == 0
    assert "done 2, failed 0, pending 0 of 2 trials" in " ".join(out.split())  # progress counts the file as it is
    current = results(capsys, work)
    assert len(current) == 2 and {json.loads(t)["epochs"] for t in current.train} == {3}  # effective settings in every row
    assert {json.loads(p)["hidden_size"] for p in current.params} == {8}  # the removed grid value is gone
    summary = results(capsys, work, "--summary")
    assert summary[["seeds"]].to_dict("list") == {"seeds": [2]}  # 2 seeds, not 2 new + 2 old
    assert summary.mae.iloc[0] == pytest.approx(current.mae.mean(), rel=1e-12)
    everything = results(capsys, work, "--all").set_index("trial_id")
    stale = everything[everything.stale]
    assert len(stale) == 4
    by_size = {json.loads(p)["hidden_size"]: d for p, d in zip(stale.params, stale.differs, strict=True)}
    assert by_size[8] == "train.epochs 2 -> 3"
    assert by_size[16] == "params.hidden_size 16 -> 8; train.epochs 2 -> 3"
    code, out, _err = run_cli(capsys, "status", "--workdir", work, "--json")
    counts = json.loads(out)
    assert (counts["total"], counts["done"], counts["stale"]) == (2, 2, 4)
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: one line per row
    table = run_cli(capsys, "results", "--workdir", work, "--all")[1].splitlines()
    assert table[0].startswith("6 trials, 4 shown are stale")
    stale_16 = [line for line in table if "hidden_size:16" in line]
    assert len(stale_16) == 2 and all("epochs=2" in line and " stale " in line and line.endswith("params.hidden_size 16 -> 8; train.epochs 2 -> 3")
                                      for line in (line.rstrip() for line in stale_16))
    code, _out, _err = run_cli(capsys, "report", "--workdir", work)
    page = (work / "report.html").read_text()
    assert "<td>stale trials kept (an earlier file or data; not shown)</td><td>4</td>" in page.replace("\n", "")


def test_an_older_store_without_provenance_columns_is_read_and_upgraded(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_data(tmp_path / "data", "a")
    path, work = write_file(tmp_path, hidden="[8]", seeds="[0]"), tmp_path / "work"
    assert run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")[0] == 0
    with closing(sqlite3.connect(work / "gpufill.db")) as con, con:  # as a store written before provenance looked
        for column in ("data_fingerprint", "config_id", "base_id", "current"):
            con.execute(f"ALTER TABLE trials DROP COLUMN {column}")
    assert len(results(capsys, work)) == 1  # read-only readers fill in defaults
    store = Store.create(work)  # a run's writer adds the columns
    assert {"data_fingerprint", "config_id", "base_id", "current"} <= store.columns
    store.close()


def test_the_table_shows_only_the_train_settings_that_differ_between_rows():
    from gpufill.cli.campaign_tables import _varying_settings

    neural = json.dumps({"epochs": 12, "lr": 0.001})
    assert _varying_settings([neural, "{}", neural]) == ["", "", ""]  # a classical row has no settings: nothing varies
    assert _varying_settings([neural, "{}", json.dumps({"epochs": 40, "lr": 0.001})]) == ["epochs=12", "", "epochs=40"]
