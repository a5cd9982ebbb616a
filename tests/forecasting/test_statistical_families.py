"""The statistical reference families (snaive, ets, theta): series models scored on the same test
windows as every other family, in local and global campaigns."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.run.runner import Campaign, read_results
from gpufill.errors import InputError
from gpufill.forecasting.data.project import Project, season_length_of
from gpufill.forecasting.data.windows import Split, make_windows
from gpufill.forecasting.models.classical import train_classical
from gpufill.forecasting.recipes import RECIPES
from tests.helpers import write_campaign


def _monthly(values: np.ndarray, name: str = "shop") -> Project:
    time = pd.date_range("2000-01-01", periods=len(values), freq="MS").to_numpy()
    return Project(name=name, target=values.astype(np.float64), covariates=np.zeros((len(values), 0)), covariate_names=(), source="shop.csv", time=time)


def test_the_season_comes_from_the_time_index():
    def stamps(freq: str) -> np.ndarray:
        return pd.date_range("2020-01-06", periods=30, freq=freq).to_numpy()

    assert [season_length_of(stamps(f), "x.csv") for f in ("MS", "ME", "D", "W-MON", "QS", "h")] == [12, 12, 7, 52, 4, 24]
    assert season_length_of(None, "x.csv") == 1 and season_length_of(None, "synthetic") == 7
    irregular = np.array(["2020-01-01", "2020-01-02", "2020-01-05", "2020-01-09"], dtype="datetime64[ns]")
    assert season_length_of(irregular, "x.csv") == 1


def test_seasonal_naive_on_a_pure_seasonal_series_is_exact():
    season = np.array([10.0, 12, 15, 11, 9, 8, 14, 20, 18, 13, 11, 10])
    windows = make_windows(_monthly(np.tile(season, 12)), lookback=12, horizon=3, split=Split(val=12, test=24))
    assert windows.season_length == 12
    run = train_classical(windows, "snaive")
    assert run.test["mae"] == 0.0 and run.test["smape"] == 0.0 and run.naive["mae"] > 1.0
    assert run.model.forecast_from(windows.series, np.array([15])).tolist() == [[11.0, 9.0, 8.0]]  # y[15:18] = y[3:6]


def test_comb_is_the_mean_of_autoets_theta_and_autotheta_fitted_as_their_own_families():
    """The statistical combination trains nothing of its own: each member fitted on the same history, its forecast the
    mean (or median) of theirs, window by window."""
    from statsforecast.models import AutoTheta

    rng = np.random.default_rng(1)
    t = np.arange(96)
    values = 50 + 0.3 * t + 6 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 1, t.size)
    windows = make_windows(_monthly(values), lookback=12, horizon=4, split=Split(val=8, test=8))
    comb, ets, theta = (train_classical(windows, family) for family in ("comb", "ets", "theta"))
    history = windows.series[: windows.fit_end]
    auto = AutoTheta(season_length=12).fit(y=history)
    auto_theta = np.stack([auto.forward(y=windows.series[:origin], h=4)["mean"] for origin in windows.test_origins])
    members = np.stack([np.asarray(ets.forecast["forecast"]), np.asarray(theta.forecast["forecast"]), auto_theta])
    np.testing.assert_allclose(comb.forecast["forecast"], members.mean(axis=0), rtol=1e-5)
    median = train_classical(windows, "comb", {"combine": "median"})
    np.testing.assert_allclose(median.forecast["forecast"], np.median(members, axis=0), rtol=1e-5)
    assert comb.params == {"season_length": "auto", "combine": "mean"} and comb.val is not None  # chosen on validation like any family
    with pytest.raises(InputError) as bad:
        train_classical(windows, "comb", {"combine": "best"})
    assert bad.value.field == "comb.combine"


@pytest.mark.slow
def test_ets_and_theta_beat_the_last_value_on_a_trending_seasonal_series():
    rng = np.random.default_rng(0)
    t = np.arange(144)
    values = 100 + 0.5 * t + 10 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 1, t.size)
    windows = make_windows(_monthly(values), lookback=24, horizon=6, split=Split(val=12, test=24))
    for family in ("ets", "theta"):
        run = train_classical(windows, family)
        assert np.isfinite(list(run.test.values())).all()
        assert run.test["mae"] < 0.5 * run.naive["mae"], family  # the season alone is worth most of the error
    fixed = train_classical(windows, "ets", {"model": "AAA", "season_length": 12})
    assert fixed.params == {"season_length": 12, "model": "AAA"} and fixed.test["mae"] < fixed.naive["mae"]
    with pytest.raises(InputError) as bad:
        train_classical(windows, "ets", {"model": "XYZ"})
    assert bad.value.field == "ets.model"


def test_in_a_campaign_the_references_run_on_the_cpu_lane_and_global_mode_fits_them_per_project(tmp_path):
    scores = {}
    for mode in ("local", "global"):
        path = write_campaign(tmp_path, name=f"refs-{mode}", models="snaive: {}\n  theta: {}", projects=2)
        path.write_text(path.read_text().replace("task: {lookback: [12], horizon: 1}", f"task: {{lookback: [12], horizon: 2, mode: {mode}}}"))
        outcome = Campaign.from_yaml(path, tmp_path / mode).run(executor="inline")
        assert (outcome.done, outcome.failed) == ((4, 0) if mode == "local" else (2, 0))
        scores[mode] = read_results(tmp_path / mode)
    local = scores["local"].set_index(["family", "project"])["mae"]
    global_ = scores["global"]
    assert set(global_["lane"]) == {"cpu"} and set(scores["local"]["lane"]) == {"cpu"}
    for row in global_.itertuples():  # a series model is the same model in either mode: the mean of the local scores
        assert row.mae == pytest.approx(local.loc[row.family].mean(), rel=1e-9)


def test_the_summary_measures_every_family_against_the_seasonal_naive(tmp_path, capsys):
    from gpufill.campaign.results.reading import best_per_project, read_best
    from tests.helpers import run_cli

    path = write_campaign(tmp_path, name="ratio", models="snaive: {}\n  linear: {}\n  comb: {}", projects=2)
    Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    rows = read_best(tmp_path / "w")
    by = {(row["project"], row["family"]): row for row in rows}
    for project in ("p000", "p001"):
        assert by[(project, "snaive")]["vs_snaive"] == 1.0
        assert by[(project, "linear")]["vs_snaive"] == pytest.approx(by[(project, "linear")]["mae"] / by[(project, "snaive")]["mae"])
        # and against the statistical combination, the line a learned ensemble has to beat
        assert by[(project, "linear")]["vs_comb"] == pytest.approx(by[(project, "linear")]["mae"] / by[(project, "comb")]["mae"])
    frame = best_per_project(read_results(tmp_path / "w"))  # the pandas path (csv, report) says the same
    assert frame.set_index(["project", "family"])["vs_snaive"].to_dict() == pytest.approx({key: row["vs_snaive"] for key, row in by.items()})
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", tmp_path / "w")
    assert code == 0 and "vs snaive" in out and "vs comb" in out


def _long_and_short_sales(folder) -> None:
    """sales.csv: a 200- and a 45-point store around 50, swinging by 5."""
    rng = np.random.default_rng(0)
    lengths = {"long": 200, "short": 45}
    frame = pd.concat([pd.DataFrame({"store": name, "y": 50 + np.sin(np.arange(n) / 2) * 5 + rng.normal(0, 1, n)}) for name, n in lengths.items()])
    frame.to_csv(folder / "sales.csv", index=False)


def test_in_local_mode_a_too_short_project_sits_out_the_lookbacks_it_cannot_hold(tmp_path):
    _long_and_short_sales(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text("name: short\ndata: {source: sales.csv, target: y, project_column: store}\n"
                    "task: {lookback: [8, 40], horizon: 1, split: {val: 0.1, test: 0.2}}\nmodels: {linear: {}, snaive: {season_length: 4}}\nseeds: [0]\n")
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    # linear at each lookback of the long project and at 8 of the short one; snaive once per project (at the shortest lookback)
    assert (outcome.done, outcome.failed) == (5, 0)
    results = read_results(tmp_path / "w")
    assert sorted(zip(results["project"], results["family"], results["lookback"], strict=True)) == sorted(
        [("long", "linear", 8), ("long", "linear", 40), ("long", "snaive", 8), ("short", "linear", 8), ("short", "snaive", 8)])
    notes = _run_events(tmp_path / "w", "left out")
    assert len(notes) == 1 and notes[0].startswith("project short left out at lookback 40 (1 trial): series too short: length 45")



def _run_events(workdir, containing: str) -> list[str]:
    """The messages of the run events in `workdir`'s store that contain `containing`."""
    from gpufill.campaign.store.store import Store

    store = Store.open(workdir)
    try:
        return [e["message"] for e in store.events() if containing in e["message"]]
    finally:
        store.close()


def test_in_global_mode_a_padded_short_series_trains_and_scores(tmp_path):
    """One model over a long and a short series: at lookback 40 the short one (45 points, 31 before its
    validation) is left-padded; a network, a window regressor and seasonal naive all score it."""
    _long_and_short_sales(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text("name: padded\ndata: {source: sales.csv, target: y, project_column: store}\n"
                    "task: {lookback: [40], horizon: 2, mode: global, split: {val: 0.1, test: 0.2}}\n"
                    "models: {linear: {}, snaive: {season_length: 4}, mlp: {hidden_size: 8}}\ntrain: {epochs: 3}\nseeds: [0]\n")
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    assert (outcome.done, outcome.failed) == (3, 0)
    with sqlite3.connect(tmp_path / "w" / "gpufill.db") as con:
        rows = {family: (json.loads(metrics), json.loads(plan)) for family, metrics, plan in con.execute("SELECT family, metrics, plan FROM trials")}
    for family, (metrics, _plan) in rows.items():
        short = metrics["per_project"]["short"]
        assert np.isfinite(short["test"]["mae"]) and short["test"]["mae"] < 20, (family, short)  # level 50, swing 5
    plan = rows["mlp"][1]
    assert plan["scaling"] == {"value": "last", "reason": RECIPES["mlp"].why["scaling"]} and plan["loss"]["value"] == "mae"
    assert rows["linear"][1]["scaling"]["value"] == "project" and "loss" not in rows["linear"][1] and "scaling" not in rows["snaive"][1]
    notes = _run_events(tmp_path / "w", "left-padded")
    assert len(notes) == 1 and notes[0].startswith("project short (length 45) is left-padded at lookback 40")


def test_a_backtest_scores_each_rolling_origin_and_its_metrics_are_their_mean(tmp_path):
    from gpufill.campaign.store.store import Store

    path = write_campaign(tmp_path, name="bt", models="linear: {}\n  snaive: {}\n  mlp: {hidden_size: 8}", projects=2, epochs=2)
    path.write_text(path.read_text().replace("task: {lookback: [12], horizon: 1}",
                                             "task: {lookback: [12], horizon: 3, split: {val: 0.1, test: {backtest: {windows: 3, step: 6}}}}"))
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    assert (outcome.done, outcome.failed) == (6, 0)
    results = read_results(tmp_path / "w")
    store = Store.open(tmp_path / "w")
    try:
        for trial in results.itertuples():
            details = store.trial_details(trial.trial_id)
            origins = details["metrics"]["per_origin"]
            # 300 points: the last origin forecasts points 297-299, the others 6 and 12 steps before it.
            assert [o["origin"] for o in origins] == [285, 291, 297]
            for metric in ("mae", "rmse", "smape", "mase"):
                assert getattr(trial, metric) == pytest.approx(np.mean([o[metric] for o in origins]), rel=1e-9)
            kept = store.forecasts([trial.trial_id])[(trial.trial_id, trial.project)]
            assert kept["forecast"].shape == (3, 3) and kept["origins"].tolist() == [285, 291, 297]
    finally:
        store.close()
    with pytest.raises(InputError, match="windows"):
        path.write_text(path.read_text().replace("windows: 3", "windows: 0"))
        Campaign.from_yaml(path, tmp_path / "x")


def test_the_backtest_needs_room_for_its_origins():
    values = np.arange(40, dtype=np.float64)
    with pytest.raises(InputError, match="series too short"):
        make_windows(_monthly(values), lookback=12, horizon=3, split=Split(val=0, test=0, backtest=(5, 6)))  # needs 12 + 3 + 27
    windows = make_windows(_monthly(np.arange(42, dtype=np.float64)), lookback=12, horizon=3, split=Split(val=0, test=0, backtest=(5, 6)))
    assert windows.test_origins.tolist() == [15, 21, 27, 33, 39] and windows.backtest
