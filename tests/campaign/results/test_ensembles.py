"""Test forecasts kept in the store (`results --forecasts`) and ensembles of a configuration's seeds
(`results --ensemble`)."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.run.runner import Campaign, read_results
from tests.helpers import write_campaign


def test_forecasts_are_kept_and_an_ensemble_of_one_member_is_that_member(tmp_path, capsys):
    from gpufill.campaign.results.ensembles import ensembles, forecast_rows
    from tests.helpers import run_cli

    path = write_campaign(tmp_path, name="ens", models="linear: {}\n  mlp: {hidden_size: 8}", projects=2, epochs=2)
    path.write_text(path.read_text().replace("seeds: [0]", "seeds: [0, 1, 2]"))
    Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    results = read_results(tmp_path / "w")
    rows = pd.DataFrame(forecast_rows(tmp_path / "w"))
    # Every trial's forecasts are there: its test windows x horizon, and they give back its own MAE.
    for trial in results.itertuples():
        mine = rows[rows["trial_id"] == trial.trial_id]
        assert len(mine) == 60 and mine["step"].eq(1).all()  # 300 points, 20 % test, horizon 1
        assert (mine["forecast"] - mine["actual"]).abs().mean() == pytest.approx(trial.mae, rel=1e-5)
    median = pd.DataFrame(ensembles(tmp_path / "w", "median"))
    assert len(median) == 4 and set(median["members"]) == {3}
    for row in median.itertuples():  # the median of three seeds, by hand
        members = results[(results["family"] == row.family) & (results["project"] == row.project)]["trial_id"]
        stacked = np.stack([rows[rows["trial_id"] == t].sort_values("origin")["forecast"].to_numpy() for t in members])
        truth = rows[rows["trial_id"] == members.iloc[0]].sort_values("origin")["actual"].to_numpy()
        assert row.mae == pytest.approx(np.abs(np.median(stacked, axis=0) - truth).mean(), rel=1e-5)
        assert row.member_mae_best <= row.member_mae_mean + 1e-9
    linear = median[median["family"] == "linear"]  # deterministic: three identical members
    assert np.allclose(linear["mae"], linear["member_mae_best"])
    path.write_text(path.read_text().replace("seeds: [0, 1, 2]", "seeds: [0]"))
    seed0 = results[results["seed"] == 0]
    Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")  # the file now has one seed: seeds 1 and 2 are stale, one member each
    one = pd.DataFrame(ensembles(tmp_path / "w", "mean")).set_index(["family", "project"])
    assert set(one["members"]) == {1}
    for trial in seed0.itertuples():
        assert one.loc[(trial.family, trial.project), "mae"] == pytest.approx(trial.mae, rel=1e-5)
    code, out, _ = run_cli(capsys, "results", "--ensemble", "median", "--workdir", tmp_path / "w")
    assert code == 0 and "median ensembles" in out
    code, _, err = run_cli(capsys, "results", "--forecasts", "--workdir", tmp_path / "w")
    assert code == 2 and "--format csv" in err


def test_global_models_of_several_seeds_train_alone_and_ensemble_per_project(tmp_path):
    from gpufill.campaign.results.ensembles import ensembles

    path = write_campaign(tmp_path, name="glob", models="mlp: {hidden_size: 8}\n  snaive: {}", projects=3, epochs=2)
    text = path.read_text().replace("seeds: [0]", "seeds: [0, 1]").replace("task: {lookback: [12], horizon: 1}", "task: {lookback: [12], horizon: 2, mode: global}")
    path.write_text(text)
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")  # two global mlp trials of one shape: not a fused pack (it knows no '*')
    assert (outcome.done, outcome.failed) == (3, 0)  # snaive is deterministic: one seed
    median = pd.DataFrame(ensembles(tmp_path / "w", "median"))
    assert sorted(median["project"].unique()) == ["p000", "p001", "p002"]  # a global model's forecasts are kept per project
    assert median.groupby("family")["members"].max().to_dict() == {"mlp": 2, "snaive": 1}
    results = read_results(tmp_path / "w")
    mlp = median[median["family"] == "mlp"]
    # The global trials' MAE is the mean over projects of their per-project MAE: the members' mean MAE averages to it.
    assert mlp["member_mae_mean"].mean() == pytest.approx(results[results["family"] == "mlp"]["mae"].mean(), rel=1e-5)


@pytest.mark.parametrize("mode", ["local", "global"])
def test_each_trials_validation_forecasts_are_kept_and_give_back_its_validation_score(tmp_path, capsys, mode):
    from gpufill.campaign.results.ensembles import forecast_rows
    from tests.helpers import run_cli

    path = write_campaign(tmp_path, name="val", models="mlp: {hidden_size: 8}\n  linear: {}\n  snaive: {}", projects=3, epochs=2)
    path.write_text(path.read_text().replace("task: {lookback: [12], horizon: 1}",
                                             f"task: {{lookback: [12], horizon: 3, split: {{val: 30, test: 30}}, mode: {mode}}}"))
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    assert outcome.failed == 0
    results = read_results(tmp_path / "w")
    val = pd.DataFrame(forecast_rows(tmp_path / "w", window="val"))
    test = pd.DataFrame(forecast_rows(tmp_path / "w"))
    assert set(val["trial_id"]) == set(results["trial_id"]) and len(results) == (3 if mode == "global" else 9)
    for trial in results.itertuples():
        mine = val[val["trial_id"] == trial.trial_id]
        assert sorted(mine["step"].unique()) == [1, 2, 3] and mine["project"].nunique() == (3 if mode == "global" else 1)
        # Before the test: every validation forecast starts before the first test origin of its project.
        first_test = test[test["trial_id"] == trial.trial_id].groupby("project")["origin"].min()
        assert (mine.groupby("project")["origin"].max() < first_test).all()
        per_project = mine.assign(error=(mine["forecast"] - mine["actual"]).abs()).groupby("project")["error"].mean()
        assert per_project.mean() == pytest.approx(trial.val_mae, rel=1e-5), trial.family
    code, out, _ = run_cli(capsys, "results", "--forecasts", "--window", "val", "--format", "csv", "--workdir", tmp_path / "w")
    shown = pd.read_csv(io.StringIO(out))
    assert code == 0 and len(shown) == len(val) and np.allclose(shown["forecast"].sum(), val["forecast"].sum())
    code, _, err = run_cli(capsys, "results", "--window", "val", "--workdir", tmp_path / "w")
    assert code == 2 and "--window" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "field"), [(("--ensemble", "best"), "--ensemble"), (("--ensemble", "median", "--ensemble-over", "lookback"), "--ensemble-over"),
                                             (("--ensemble", "median", "--forecasts"), "--ensemble")])
def test_bad_forecast_views_are_one_line_and_exit_2(tmp_path, capsys, args, field):
    from tests.helpers import run_cli

    path = write_campaign(tmp_path, name="views", models="linear: {}", projects=1)
    Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    code, _, err = run_cli(capsys, "results", *args, "--workdir", tmp_path / "w")
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err and "Traceback" not in err


@pytest.mark.parametrize("table", ["forecasts", "val_forecasts"])
def test_a_damaged_forecast_row_is_one_line_naming_its_table_and_nothing_is_changed(tmp_path, capsys, table):
    import sqlite3

    from gpufill.campaign.store.store import DB_NAME
    from tests.helpers import run_cli

    path = write_campaign(tmp_path, name="dmg", models="linear: {}", projects=1, epochs=1)
    path.write_text(path.read_text().replace("task: {lookback: [12], horizon: 1}", "task: {lookback: [12], horizon: 2, split: {val: 20, test: 20}}"))
    Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    db_path = tmp_path / "w" / DB_NAME
    with sqlite3.connect(db_path) as db:
        db.execute(f"UPDATE {table} SET forecast = substr(forecast, 1, 6)")  # a torn row: 6 bytes are not whole float32 pairs
    before = db_path.read_bytes()
    window = "val" if table == "val_forecasts" else "test"
    code, out, err = run_cli(capsys, "results", "--forecasts", "--window", window, "--format", "csv", "--workdir", tmp_path / "w")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and f"{table}.forecast" in err and "Traceback" not in err
    assert db_path.read_bytes() == before
