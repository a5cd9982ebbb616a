"""`gpufill forecast`: the chosen forecasters trained on all the data forecast past its end, with intervals.

The future path is the tested path: a campaign (networks with `train.refit`, and a statistical family) forecasting
series whose last horizon is cut off gives back, trial by trial and combined, the test forecasts the campaign stored
for those values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store
from tests.helpers import run_cli

HORIZON = 4


def write_data(path: Path, *, cut: int = 0) -> pd.DataFrame:
    """Three monthly series (one with a covariate column shared by all), the last `cut` months of each left out."""
    rng = np.random.default_rng(3)
    frames = []
    for index, name in enumerate(("north", "south", "west")):
        t = np.arange(96)
        level = 100 * (index + 1)
        frames.append(pd.DataFrame({"project": name, "month": pd.date_range("2015-01-01", periods=96, freq="MS"),
                                    "sales": level + 10 * np.sin(2 * np.pi * t / 12) + t * 0.3 + rng.normal(0, 1, t.size)}))
    data = pd.concat(frames, ignore_index=True)
    if cut:
        data = data[data.groupby("project").cumcount(ascending=False) >= cut]
    data.to_csv(path, index=False)
    return data


CAMPAIGN = f"""name: future
data: {{source: sales.csv, target: sales, project_column: project, time_column: month}}
task: {{lookback: [12], horizon: {HORIZON}, split: {{val: 24, test: {HORIZON}}}, metric: smape}}
models:
  mlp: {{hidden_size: 8}}
  ets: {{}}
ensemble: {{families: [mlp, ets], within: null, combine: mean}}
train: {{epochs: 150, lr: 0.01, refit: true, early_stopping: {{patience: 3}}}}
seeds: [0, 1]
resources: {{retries: 0}}
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("future")
    write_data(folder / "sales.csv")
    (folder / "future.yaml").write_text(CAMPAIGN)
    with pytest.MonkeyPatch.context() as patch:  # run as a user does, with relative paths (forecast is asked from elsewhere below)
        patch.chdir(folder)
        outcome = Campaign.from_yaml(Path("future.yaml"), Path("work")).run(executor="inline")
    assert (outcome.done, outcome.failed) == (9, 0)  # 3 projects x (2 mlp seeds + ets)
    store = Store.open(folder / "work")
    try:  # early stopping chose each network's length, shorter than it trained: the refit's rule is what is tested
        lengths = [(d["metrics"]["fit_refit_epochs"], len(d["history"])) for d in map(store.trial_details, (r["trial_id"] for r in store.records()))
                   if d["history"]]
    finally:
        store.close()
    assert len(lengths) == 6 and all(refit < trained for refit, trained in lengths), lengths
    return folder


def stored_test_forecasts(workdir: Path) -> dict[tuple[str, str], np.ndarray]:
    store = Store.open(workdir)
    try:
        ids = [r["trial_id"] for r in store.records() if r["status"] == "done"]
        return {key: kept["forecast"][-1] for key, kept in store.forecasts(ids).items()}
    finally:
        store.close()


@pytest.mark.slow
def test_the_future_of_series_cut_short_is_the_campaigns_test_forecast(campaign, capsys):
    """Forecasting the data with its last horizon cut off trains each chosen trial on what the campaign's refit trained
    on, for the epochs its early stopping chose: the stored test forecasts come back, member by member and combined."""
    full = pd.read_csv(campaign / "sales.csv", parse_dates=["month"])
    write_data(campaign / "cut.csv", cut=HORIZON)
    code, out, _ = run_cli(capsys, "forecast", "--workdir", str(campaign / "work"), "--data", str(campaign / "cut.csv"),
                           "--out", str(campaign / "future.csv"))
    assert code == 0 and "3 project(s) x 4 step(s)" in out and "9 trained on all the data now, 0 read back" in out, out
    stored = stored_test_forecasts(campaign / "work")
    kept = {}
    for path in (campaign / "work" / "future").glob("*.json"):
        content = json.loads(path.read_text())
        for project, values in content["forecasts"].items():
            kept[(content["trial_id"], project)] = np.asarray(values)
    assert set(kept) == set(stored) and len(kept) == 9
    for key, values in kept.items():  # every member, network (refit length) and ETS alike
        np.testing.assert_allclose(values, stored[key], rtol=1e-5, err_msg=str(key))
    rows = pd.read_csv(campaign / "future.csv", parse_dates=["time"])
    assert len(rows) == 3 * HORIZON and set(rows["model"]) == {"ensemble (mean of 3)"}
    for project, group in rows.groupby("project"):
        members = [stored[key] for key in stored if key[1] == project]
        np.testing.assert_allclose(group["forecast"], np.mean(members, axis=0), rtol=2e-4, atol=1e-3)
        # The future's months are the ones cut off
        assert group["time"].tolist() == full[full.project == project]["month"].iloc[-HORIZON:].tolist()
        assert (group["lo_95"] <= group["lo_80"]).all() and (group["lo_80"] < group["forecast"]).all()
        assert (group["forecast"] < group["hi_80"]).all() and (group["hi_80"] <= group["hi_95"]).all()
        assert set(group["interval_from"]) == {"series"}  # 24 validation months: 21 windows a series, enough for 95 %


@pytest.mark.slow
def test_forecasting_again_trains_nothing_and_bad_requests_are_one_line(campaign, capsys):
    work = str(campaign / "work")
    code, out, _ = run_cli(capsys, "forecast", "--workdir", work, "--from", "best")
    assert code == 0 and "3 project(s) x 4 step(s)" in out, out
    with pytest.MonkeyPatch.context() as patch:  # from another directory: the data is found where the run found it
        patch.chdir(campaign.parent)
        code, again, _ = run_cli(capsys, "forecast", "--workdir", work, "--from", "best", "--out", str(campaign / "elsewhere.csv"))
    assert code == 0 and "3 project(s) x 4 step(s)" in again, again
    # What the intervals are worth, measured on the test windows (never used to calibrate them), said with the forecast
    from gpufill.campaign.future.forecast import held_out, interval_scores
    from gpufill.campaign.future.intervals import coverage

    store = Store.open(campaign / "work")
    try:
        rows = held_out(store, how="best")
    finally:
        store.close()
    scores = interval_scores(rows)
    assert len(rows) == 3 and scores[80]["series"] == 3
    assert scores[80]["coverage"] == pytest.approx(np.mean([coverage(r["truth"], *r["bounds"][80]) for r in rows]))
    assert f"80 % covered {100 * scores[80]['coverage']:.1f} % (MSIS {scores[80]['msis']:.3g})" in out, out
    first = pd.read_csv(campaign / "work" / "forecast.csv")
    code, out, _ = run_cli(capsys, "forecast", "--workdir", work, "--from", "best", "--horizon", "2", "--level", "90")
    assert code == 0 and "0 trained on all the data now" in out, out  # the same data: every chosen trial read back
    again = pd.read_csv(campaign / "work" / "forecast.csv")
    assert list(again.columns) == ["project", "step", "time", "model", "forecast", "lo_90", "hi_90", "interval_from"]
    np.testing.assert_array_equal(again["forecast"], first[first.step <= 2]["forecast"])
    # --data holding some of the projects only: those are forecast, the others said, nothing breaks
    write_data(campaign / "two.csv")
    two = pd.read_csv(campaign / "two.csv")
    two[two.project != "west"].to_csv(campaign / "two.csv", index=False)
    code, out, _ = run_cli(capsys, "forecast", "--workdir", work, "--from", "best", "--data", str(campaign / "two.csv"), "--out", str(campaign / "two-out.csv"))
    assert code == 0 and "2 project(s) x 4 step(s)" in out and "note: project west: not in the data given, not forecast" in out, out
    for args, field in ((["--horizon", "9"], "--horizon"), (["--level", "120"], "--level"), (["--from", "nope"], "--from"),
                        (["--out", str(campaign / "x.txt")], "--out")):
        code, _, err = run_cli(capsys, "forecast", "--workdir", work, *args)
        assert code == 2 and field in err and len(err.strip().splitlines()) == 1, (args, err)


@pytest.mark.slow
def test_the_reports_forecast_panels_draw_every_step_with_the_intervals(campaign, tmp_path, capsys):
    """A horizon of 4: each panel draws whole 4-step paths with the 80 and 95 % bands `gpufill forecast` would give
    them, and the page renders in headless Chromium."""
    from tests.helpers import CHROMIUM, check_in_chromium

    report = tmp_path / "report.html"
    code, _, _ = run_cli(capsys, "report", "--workdir", str(campaign / "work"), "--out", str(report))
    page = report.read_text()
    assert code == 0 and ("Line charts: actual vs forecast over the test windows (every one of 4 steps, with intervals from the validation "
                          "errors), best and worst project of 2 families") in page
    assert "<h3>Intervals on the test windows</h3>" in page and "ensemble (mean of 3)" in page  # what gpufill forecast would ship
    intervals = page.split("<table id='intervals'>", 1)[1].split("</table>", 1)[0]
    assert intervals.count("<tr>") == 3 and "80 %" in intervals and "95 %" in intervals
    if CHROMIUM.exists():
        assert check_in_chromium(report, tmp_path) >= 2


@pytest.mark.slow
def test_a_global_ensemble_calibrates_over_every_series_and_leaves_a_level_it_cannot_bound_empty(tmp_path, capsys):
    """One model over 3 series, 5 validation windows each: each series alone is too few for any level, the 15 together
    bound 80 % (4 needed) but not 95 % (19): its bounds stay empty, and the command says why."""
    (tmp_path / "g.yaml").write_text("name: g\ndata: {source: synthetic, projects: 3, length: 160, seed: 2}\n"
                                     "task: {lookback: [8], horizon: 4, split: {val: 8, test: 4}, mode: global}\n"
                                     "models:\n  mlp: {hidden_size: 8}\nensemble: {families: [mlp], within: null}\n"
                                     "train: {epochs: 4, refit: true}\nseeds: [0, 1]\nresources: {retries: 0}\n")
    assert Campaign.from_yaml(tmp_path / "g.yaml", tmp_path / "w").run(executor="inline").done == 2
    code, out, _ = run_cli(capsys, "forecast", "--workdir", str(tmp_path / "w"))
    assert code == 0 and "3 project(s) x 4 step(s)" in out and "2 trained on all the data now" in out, out
    assert "95 % bounds left empty where the validation windows are too few for them (15 at most; a 95 % interval needs 19)" in out
    rows = pd.read_csv(tmp_path / "w" / "forecast.csv")
    assert len(rows) == 12 and set(rows["interval_from"]) == {"pooled"} and set(rows["model"]) == {"ensemble (median of 2)"}
    assert rows["lo_80"].notna().all() and (rows["lo_80"] < rows["forecast"]).all() and rows["lo_95"].isna().all() and rows["hi_95"].isna().all()


@pytest.mark.slow
def test_quantile_networks_forecast_their_own_bands_moved_by_validation_and_the_future_path_is_the_tested_one(tmp_path, capsys):
    """`loss: quantile`: each network forecasts the median and the 80 and 95 % bounds; the store keeps the quantiles
    beside the forecast, the future of series cut short gives them back, and the intervals are the combined band moved
    by how far the validation values fell outside it (not a symmetric width around the point)."""
    write_data(tmp_path / "sales.csv")
    write_data(tmp_path / "cut.csv", cut=HORIZON)
    (tmp_path / "q.yaml").write_text(CAMPAIGN.replace("  ets: {}\n", "").replace("ensemble: {families: [mlp, ets], within: null, combine: mean}\n", "")
                                     .replace("refit: true,", "refit: true, loss: quantile,"))
    assert Campaign.from_yaml(tmp_path / "q.yaml", tmp_path / "work").run(executor="inline").done == 6
    store = Store.open(tmp_path / "work")
    try:
        ids = [r["trial_id"] for r in store.records() if r["status"] == "done"]
        test, val = store.forecasts(ids), store.forecasts(ids, window="val")
    finally:
        store.close()
    for kept in (*test.values(), *val.values()):
        quantiles = kept["quantiles"]
        assert quantiles.shape == (*kept["forecast"].shape, 5) and (np.diff(quantiles, axis=-1) >= 0).all()
        np.testing.assert_array_equal(quantiles[..., 2], kept["forecast"])  # the point forecast is the median
    measured = json.loads((tmp_path / "work" / "tune" / "tune-cache.json").read_text())
    code, out, _ = run_cli(capsys, "forecast", "--workdir", str(tmp_path / "work"), "--data", str(tmp_path / "cut.csv"),
                           "--out", str(tmp_path / "future.csv"))
    assert code == 0 and "6 trained on all the data now" in out, out
    # Trained again at the campaign's threads, each network found the campaign's measured choices: nothing measured anew.
    assert json.loads((tmp_path / "work" / "tune" / "tune-cache.json").read_text()).keys() == measured.keys()
    for path in (tmp_path / "work" / "future").glob("*.json"):
        content = json.loads(path.read_text())
        for project, values in content["quantiles"].items():
            np.testing.assert_allclose(values, test[(content["trial_id"], project)]["quantiles"][-1], rtol=1e-5, atol=1e-4)
    rows = pd.read_csv(tmp_path / "future.csv")
    assert set(rows["interval_from"]) == {"series (quantiles)"} and len(rows) == 3 * HORIZON
    assert (rows["lo_95"] <= rows["lo_80"]).all() and (rows["lo_80"] <= rows["forecast"]).all()
    assert (rows["forecast"] <= rows["hi_80"]).all() and (rows["hi_80"] <= rows["hi_95"]).all()
    below, above = rows["forecast"] - rows["lo_80"], rows["hi_80"] - rows["forecast"]
    assert not np.allclose(below, above, rtol=1e-3)  # the network's own band: not one width each side of the point
    # The report's panels shade the same bands: each series calibrated on its own 21 validation windows, both levels banded
    from gpufill.report.html import _bands

    firsts = {("mlp", project): min(t for (t, p) in test if p == project) for project in ("north", "south", "west")}
    calibrations = _bands(firsts, test, val)
    assert {c.described for c in calibrations.values()} == {"series (quantiles)"} and all(c.banded == {80, 95} for c in calibrations.values())
    code, _, _ = run_cli(capsys, "report", "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "report.html"))
    assert code == 0 and "<h3>Intervals on the test windows</h3>" in (tmp_path / "report.html").read_text()
