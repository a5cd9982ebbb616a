"""A declared ensemble's members chosen on validation (issue 38 item 2): a member much worse than the best on the
validation window is left out and the summary says so; the ensemble's lookbacks apply to its member families only."""

from __future__ import annotations

import numpy as np
import pytest

from gpufill.campaign.results.ensembles import members_shown, read_declared
from gpufill.campaign.results.reading import read_best
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import expand
from gpufill.forecasting.data.metrics import forecast_metrics

# mlp on the project's scaling with 3 epochs is about 2x worse than linear on validation (and on test) here.
YAML = """name: members
data: {source: synthetic, projects: 2, length: 200, seed: 1}
task: {lookback: [6], horizon: 3, split: {val: 20, test: 20}}
models:
  mlp: {hidden_size: 8, lr: [0.01, 1.0e-9], scaling: project}
  linear: {}
  snaive: {season_length: 7}
ensemble: {families: [mlp, linear], lookbacks: [4]}
train: {epochs: 3, early_stopping: null}
seeds: [0, 1]
resources: {retries: 0}
"""


def _run(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    outcome = Campaign.from_yaml(path, tmp_path / "w").run(executor="inline")
    store = Store.open(tmp_path / "w")
    try:
        records = [r for r in store.records() if r["status"] == "done"]
        kept = store.forecasts([r["trial_id"] for r in records])
        return outcome, read_declared(store), records, kept
    finally:
        store.close()


def test_a_member_far_worse_on_validation_is_left_out_and_the_summary_says_so(tmp_path):
    outcome, declared, records, kept = _run(tmp_path, YAML)
    assert (outcome.done, outcome.failed) == (2 * (8 + 4 + 1), 0)
    for row in declared:
        mine = [r for r in records if r["project"] == row["project"] and r["family"] in ("mlp", "linear")]
        best = min(r["val_mae"] for r in mine)
        far = {r["trial_id"] for r in mine if r["val_mae"] > 1.5 * best}
        assert len(far) == 8 and {r["family"] for r in mine if r["trial_id"] in far} == {"mlp"}  # the data make it so
        assert {m["trial_id"] for m in row["left_out"]} == far and row["members"] == 4 and row["families"] == ["linear"]
        assert all(m["val_mae"] > 1.5 * m["best"] for m in row["left_out"])
        joined = [kept[(r["trial_id"], row["project"])] for r in mine if r["trial_id"] not in far]
        median = np.median(np.stack([f["forecast"] for f in joined]).astype(np.float64), axis=0)
        assert row["mae"] == pytest.approx(forecast_metrics(joined[0]["truth"].astype(np.float64), median, joined[0]["mase_scale"])["mae"], rel=1e-9)
    summary = [row for row in read_best(tmp_path / "w") if row["family"].startswith("ensemble (")]
    assert [row["family"] for row in summary] == ["ensemble (median; 4 of 12 members; 8 left out on validation, > 1.5x the best member's)"] * 2


def test_within_null_keeps_every_member(tmp_path):
    outcome, declared, _, _ = _run(tmp_path, YAML.replace("lookbacks: [4]}", "lookbacks: [4], within: null}"))
    assert outcome.failed == 0 and [(row["members"], row["left_out"]) for row in declared] == [(12, []), (12, [])]


def test_the_ensembles_lookbacks_apply_to_its_member_families_only(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(YAML.replace("families: [mlp, linear]", "families: [mlp]"))
    spec = load_campaign(path)
    assert spec.task.lookback == [6] and spec.every_lookback == [6, 12]
    assert (spec.lookbacks("mlp"), spec.lookbacks("linear"), spec.lookbacks("snaive")) == ([6, 12], [6], [6])
    trials = expand(spec, ["p000"])
    by_family = {family: sorted({t.lookback for t in trials if t.family == family}) for family in ("mlp", "linear", "snaive")}
    assert by_family == {"mlp": [6, 12], "linear": [6], "snaive": [6]}
    assert sum(t.family == "linear" for t in trials) == 2  # two seeds at one lookback (it was 4: the ensemble's lookback too)


@pytest.mark.parametrize("within", ["0.5", ".nan", "fast"])
def test_a_bad_within_is_one_line(tmp_path, capsys, within):
    from gpufill.errors import InputError
    from tests.helpers import run_cli

    path = tmp_path / "c.yaml"
    path.write_text(YAML.replace("lookbacks: [4]}", f"lookbacks: [4], within: {within}}}"))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert "within" in str(error.value) and "c.yaml:" in str(error.value)
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "within" in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()  # nothing ran, nothing was written


def _run_selecting(tmp_path, select: str, mode: str):
    """The YAML campaign with every member (within: null) and `select`, in `mode`; also the stored validation forecasts."""
    text = YAML.replace("lookbacks: [4]}", f"lookbacks: [4], within: null, select: {select}}}").replace(
        "split: {val: 20, test: 20}}", f"split: {{val: 20, test: 20}}, mode: {mode}}}")
    outcome, declared, records, kept = _run(tmp_path, text)
    assert outcome.failed == 0 and [row["project"] for row in declared] == ["p000", "p001"]
    store = Store.open(tmp_path / "w")
    try:
        val = store.forecasts([r["trial_id"] for r in records], window="val")
    finally:
        store.close()
    return declared, records, kept, val


def _validation(val, trials, projects):
    """The `trials`' stored validation forecasts over `projects` by hand: (K, N, H), the truth (N, H), each row's series."""
    forecasts = np.concatenate([np.stack([val[(r["trial_id"], p)]["forecast"] for r in trials]) for p in projects], axis=1)
    truth = np.concatenate([val[(trials[0]["trial_id"], p)]["truth"] for p in projects])
    groups = np.concatenate([[i] * len(val[(trials[0]["trial_id"], p)]["origins"]) for i, p in enumerate(projects)])
    return forecasts, truth, groups


@pytest.mark.parametrize("mode", ["local", "global"])
def test_forward_selection_chooses_members_on_their_validation_forecasts_and_weights_repeats(tmp_path, mode):
    from gpufill.campaign.results.greedy import select_greedily

    declared, records, kept, val = _run_selecting(tmp_path, "greedy", mode)
    members = [r for r in records if r["family"] in ("mlp", "linear")]
    assert len(members) == (12 if mode == "global" else 24)
    for row in declared:
        mine = sorted((r for r in members if r["project"] in (row["project"], "*")), key=lambda r: r["trial_id"])  # ties go to the first id
        projects = ["p000", "p001"] if mode == "global" else [row["project"]]  # a global model is chosen once, on every project
        # The choice by hand: the same selection on the stored validation forecasts (the test window is not an input).
        forecasts, truth, groups = _validation(val, mine, projects)
        picked = select_greedily(forecasts, truth, groups, metric="mae", combine="median")
        weights = {mine[i]["trial_id"]: count for i, count in picked.weights.items()}
        assert row["weights"] == weights and row["members"] == len(weights) and row["select"] == "greedy"
        assert sorted(m["trial_id"] for m in row["left_out"]) == sorted(r["trial_id"] for r in mine if r["trial_id"] not in weights)
        assert {m["reason"] for m in row["left_out"]} <= {"not chosen"}
        repeated = np.stack([kept[(t, row["project"])]["forecast"] for t, count in weights.items() for _ in range(count)]).astype(np.float64)
        first = kept[(mine[0]["trial_id"], row["project"])]
        by_hand = forecast_metrics(first["truth"].astype(np.float64), np.median(repeated, axis=0), first["mase_scale"])
        assert row["mae"] == pytest.approx(by_hand["mae"], rel=1e-9)
    if mode == "global":
        assert declared[0]["weights"] == declared[1]["weights"]
    summary = [row for row in read_best(tmp_path / "w") if row["family"].startswith("ensemble (")]
    left = len(declared[0]["left_out"])
    assert left > 0 and f"{left} not chosen by forward selection on validation" in summary[0]["family"]


@pytest.mark.parametrize("mode", ["local", "global"])
def test_select_best_takes_the_lookback_range_whose_combination_scores_best_on_validation(tmp_path, mode):
    """The members' lookbacks are 6 and 12: of the ranges 6, 6-12 and 12, the one whose median of validation
    forecasts scores best (by hand here, from the stored validation forecasts) joins; the test row is that range's
    median of test forecasts; the summary names the range."""
    from gpufill.forecasting.data.metrics import mean_over_series

    declared, records, kept, val = _run_selecting(tmp_path, "best", mode)
    members = [r for r in records if r["family"] in ("mlp", "linear")]
    for row in declared:
        mine = [r for r in members if r["project"] in (row["project"], "*")]
        projects = ["p000", "p001"] if mode == "global" else [row["project"]]
        scores = {}
        for name, lookbacks in (("6", {6}), ("6-12", {6, 12}), ("12", {12})):
            inside = [r for r in mine if int(r["lookback"]) in lookbacks]
            forecasts, truth, groups = _validation(val, inside, projects)
            scores[name] = float(mean_over_series(np.median(forecasts.astype(np.float64), axis=0), truth, groups, "mae"))
        assert row["lookback_range"]["scores"] == pytest.approx(scores, abs=1e-6)  # kept rounded to 6 decimals
        best = min(scores, key=scores.__getitem__)
        lookbacks = [int(v) for v in best.split("-")]
        assert row["lookbacks"] == lookbacks and row["select"] == "best" and "weights" not in row
        inside = [r for r in mine if int(r["lookback"]) in lookbacks]
        assert row["joined"] == sorted(r["trial_id"] for r in inside)
        assert sorted(m["trial_id"] for m in row["left_out"]) == sorted(r["trial_id"] for r in mine if r not in inside)
        assert {m["reason"] for m in row["left_out"]} <= {"lookbacks"}
        first = kept[(inside[0]["trial_id"], row["project"])]
        median = np.median(np.stack([kept[(r["trial_id"], row["project"])]["forecast"] for r in inside]).astype(np.float64), axis=0)
        assert row["mae"] == pytest.approx(forecast_metrics(first["truth"].astype(np.float64), median, first["mase_scale"])["mae"], rel=1e-9)
    if mode == "global":
        assert declared[0]["lookback_range"] == declared[1]["lookback_range"]
    summary = [row for row in read_best(tmp_path / "w") if row["family"].startswith("ensemble (")]
    if declared[0]["left_out"]:
        assert f"lookbacks {'-'.join(map(str, declared[0]['lookback_range']['lookbacks']))} chosen on validation" in summary[0]["family"]


def test_select_best_leaves_padded_members_out_of_each_range_on_validation_as_on_test():
    """The padded rule inside a range: a row whose window a member's lookback does not fill takes the range's members
    that fit, or its shortest lookback's where none does."""
    from gpufill.campaign.results.lookback_range import select_lookback_range

    truth = np.array([[10.0], [10.0]])
    forecasts = np.array([[[10.0], [14.0]],   # lookback 4: right on row 0, off on row 1
                          [[30.0], [10.0]]])  # lookback 8: off on row 0 (where its history is too short), right on row 1
    groups, lookbacks, fits = np.array([0, 1]), np.array([4, 8]), np.array([[True, True], [False, True]])
    kept = select_lookback_range(forecasts, truth, groups, lookbacks, metric="mae", fits=fits)
    # 4: (0 + 4) / 2 = 2; 4-8 with row 0 padded out: (0 + |12 - 10|) / 2 = 1; 8 alone, row 0 none fits -> its shortest (8): (20 + 0) / 2
    assert kept.scores == {"4": 2.0, "4-8": 1.0, "8": 10.0} and kept.lookbacks == (4, 8) and kept.score == 1.0
    plain = select_lookback_range(forecasts, truth, groups, lookbacks, metric="mae")
    assert plain.scores == {"4": 2.0, "4-8": 6.0, "8": 10.0} and plain.lookbacks == (4,)


def test_an_unknown_select_is_one_line_naming_the_field(tmp_path, capsys):
    from tests.helpers import run_cli

    path = tmp_path / "c.yaml"
    path.write_text(YAML.replace("lookbacks: [4]}", "lookbacks: [4], select: stacking}"))
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "select" in err and "greedy" in err and "best" in err and "c.yaml:" in err
    assert not (tmp_path / "work").exists()


PADDED = """name: padded
data: {source: series.csv, target: y, project_column: series}
task: {lookback: [6], horizon: 3, split: {val: 6, test: 6}, mode: global}
models:
  linear: {}
ensemble: {families: [linear], lookbacks: [4], within: null, padded: PADDED}
seeds: [0]
resources: {retries: 0}
"""


@pytest.mark.parametrize("padded", ["leave_out", "keep"])
def test_a_member_whose_lookback_a_series_cannot_fill_sits_that_series_out(tmp_path, padded):
    """Global mode pads a series shorter than a lookback; `padded: leave_out` drops the lookback-12 member from the
    series whose history before its test window is 10 values long, and says why; the long series keeps both."""
    import pandas as pd

    rng = np.random.default_rng(0)
    frames = [pd.DataFrame({"series": name, "y": 50 + 10 * np.sin(np.arange(n) / 2) + rng.normal(0, 1, n)}) for name, n in (("long", 120), ("short", 16))]
    pd.concat(frames).to_csv(tmp_path / "series.csv", index=False)
    outcome, declared, records, kept = _run(tmp_path, PADDED.replace("PADDED", padded))
    assert (outcome.done, outcome.failed) == (2, 0)  # linear at lookbacks 6 and 12, one global model each
    rows = {row["project"]: row for row in declared}
    assert (rows["long"]["members"], rows["long"]["lookbacks"], rows["long"]["left_out"]) == (2, [6, 12], [])
    short = rows["short"]
    if padded == "keep":
        assert (short["members"], short["lookbacks"], short["left_out"]) == (2, [6, 12], [])
        return
    by_lookback = {int(r["lookback"]): r for r in records}
    assert (short["members"], short["lookbacks"]) == (1, [6])
    assert [(m["trial_id"], m["lookback"], m["reason"]) for m in short["left_out"]] == [(by_lookback[12]["trial_id"], 12, "padded")]
    alone = kept[(by_lookback[6]["trial_id"], "short")]
    assert short["mae"] == pytest.approx(forecast_metrics(alone["truth"].astype(np.float64), alone["forecast"].astype(np.float64), alone["mase_scale"])["mae"], rel=1e-9)
    assert members_shown(short) == "1 of 2 members; 1 left out: lookback longer than the series' history"
    # The summary's one pooled row of a global campaign: every member, and the series some sat out.
    summary = [row for row in read_best(tmp_path / "w") if row["family"].startswith("ensemble (")]
    assert [(row["project"], row["family"], row["seeds"]) for row in summary] == [
        ("*", "ensemble (median; 2; 1 series with only the lookbacks their history fills)", 2)]
