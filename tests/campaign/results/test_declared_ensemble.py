"""A campaign's declared ensemble (issue 28): its lookbacks and losses become trials, its members of one shape train
as packs, and after the run it is combined from the members' stored forecasts and scored like a trial."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpufill.campaign.results.ensembles import read_declared
from gpufill.campaign.results.reading import read_best
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError
from gpufill.forecasting.data.metrics import forecast_metrics
from gpufill.report.html import render_report

YAML = """name: declared
data: {source: synthetic, projects: 2, length: 200, seed: 1}
task: {lookback: [6], horizon: 3, split: {val: 20, test: 20}}
models:
  mlp: {hidden_size: 8}
  linear: {}
ensemble: {families: [mlp, linear], lookbacks: [2, 4], losses: [mae, huber], within: null}
train: {epochs: 2, early_stopping: null}
seeds: [0, 1]
resources: {retries: 0, pack_size: 2}
"""


def test_the_ensembles_lookbacks_and_losses_become_trials(tmp_path):
    path = tmp_path / "declared.yaml"
    path.write_text(YAML)
    spec = load_campaign(path)
    assert spec.task.lookback == [6] and spec.lookbacks("mlp") == spec.lookbacks("linear") == [6, 12]  # 2 and 4 horizons; 6 was there already
    assert spec.models["mlp"]["loss"] == ["mae", "huber"] and "loss" not in spec.models["linear"]  # a loss is a network's
    assert spec.ensemble_members() == ["mlp", "linear"]
    assert load_campaign(path).model_dump() == spec.model_dump()  # folding is idempotent (a worker re-reads the spec)


def test_after_a_run_the_ensemble_is_the_median_of_its_members_stored_forecasts(tmp_path):
    path = tmp_path / "declared.yaml"
    path.write_text(YAML)
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    assert (outcome.done, outcome.failed) == (2 * (8 + 4), 0)  # per project: mlp 2 lookbacks x 2 losses x 2 seeds, linear 2 x 2
    store = Store.open(tmp_path / "work")
    try:
        declared = read_declared(store)
        records = [r for r in store.records() if r["status"] == "done"]
        kept = store.forecasts([r["trial_id"] for r in records])
        plans = {r["trial_id"]: store.trial_details(r["trial_id"])["plan"] for r in records if r["family"] == "mlp"}
    finally:
        store.close()
    assert [row["project"] for row in declared] == ["p000", "p001"]
    for row in declared:
        mine = [kept[(r["trial_id"], row["project"])] for r in records if r["project"] == row["project"]]
        assert row["members"] == len(mine) == 12 and row["families"] == ["linear", "mlp"] and row["lookbacks"] == [6, 12]
        median = np.median(np.stack([f["forecast"] for f in mine]).astype(np.float64), axis=0)
        by_hand = forecast_metrics(mine[0]["truth"].astype(np.float64), median, mine[0]["mase_scale"])
        assert row["mae"] == pytest.approx(by_hand["mae"], rel=1e-9) and row["smape"] == pytest.approx(by_hand["smape"], rel=1e-9)
        assert row["cost_s"] == pytest.approx(sum(r["duration_s"] for r in records), abs=1e-3)
    # Members of one shape (lookback, loss) trained as packs of two seeds.
    assert {plan["pack_size"]["value"] for plan in plans.values()} == {2}
    summary = [r for r in read_best(tmp_path / "work") if r["family"] == "ensemble (median)"]
    assert [(r["project"], r["seeds"], r["mae"]) for r in summary] == [(row["project"], 12, row["mae"]) for row in declared]
    store = Store.open(tmp_path / "work")
    try:
        page = render_report(store)
    finally:
        store.close()
    table = page[page.index("id='ensemble'"):].split("</table>")[0]  # the report shows it beside its members' best
    assert table.count("<tr>") == 1 + 2 and f"{declared[0]['mae']:.4g}" in table and ("(linear)" in table or "(mlp)" in table)


def test_a_member_that_is_not_a_family_of_the_campaign_is_one_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(YAML.replace("families: [mlp, linear]", "families: [mlp, lstm]"))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert error.value.field == "ensemble.families" and "'lstm' is not a family of models" in error.value.problem
    assert error.value.where.endswith("bad.yaml:7")


VARIANTS = """name: variants
data: {source: synthetic, projects: 2, length: 120, seed: 3}
task: {lookback: [6], horizon: 3, split: {val: 20, test: 20}, mode: global}
models:
  nbeats: {width: 8, blocks: 1, scaling: standard, loss: [mae, huber]}
  nbeats@mean: {width: 8, blocks: 1, scaling: mean, loss: [mae, smape]}
ensemble: {families: [nbeats, nbeats@mean], within: null}
train: {epochs: 2, early_stopping: null}
seeds: [0]
resources: {retries: 0}
"""


def test_a_family_and_its_variant_train_grids_that_cannot_be_one_and_join_one_ensemble(tmp_path):
    """sMAPE needs mean scaling, so `scaling: [standard, mean]` x `loss: [mae, smape]` is refused as one grid; `nbeats@mean`
    (the same family under a second name) carries the second grid, and the ensemble combines both."""
    path = tmp_path / "variants.yaml"
    path.write_text(VARIANTS)
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    assert (outcome.done, outcome.failed) == (4, 0)
    store = Store.open(tmp_path / "work")
    try:
        records = [r for r in store.records() if r["status"] == "done"]
        plans = {(r["family"], json.loads(r["train"])["loss"]): store.trial_details(r["trial_id"])["plan"] for r in records}
        declared = read_declared(store)
    finally:
        store.close()
    assert sorted(plans) == [("nbeats", "huber"), ("nbeats", "mae"), ("nbeats@mean", "mae"), ("nbeats@mean", "smape")]
    assert {key: (plan["scaling"]["value"], plan["loss"]["value"]) for key, plan in plans.items()} == {
        ("nbeats", "huber"): ("standard", "huber"), ("nbeats", "mae"): ("standard", "mae"),
        ("nbeats@mean", "mae"): ("mean", "mae"), ("nbeats@mean", "smape"): ("mean", "smape")}
    assert [(row["members"], row["families"]) for row in declared] == [(4, ["nbeats", "nbeats@mean"])] * 2  # each project
    path.write_text(VARIANTS.replace("scaling: mean, loss: [mae, smape]", "scaling: standard, loss: [mae, smape]"))
    with pytest.raises(InputError, match=r"variants.yaml:6: models.nbeats@mean.loss: loss smape with scaling standard for nbeats@mean"):
        load_campaign(path)
