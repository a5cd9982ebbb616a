"""`train: {refit: true}` in a campaign: each network, alone or in a pack, local or global, trains again on training
+ validation for the epochs its early stop chose, and says so in its plan; classical families are untouched (they
always refit); the setting is part of a trial's identity only when on, so older campaigns keep their ids."""

from __future__ import annotations

import pytest

from gpufill.campaign import expand, load_campaign
from gpufill.campaign.results.reading import read_trials
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError

REFIT = """name: refit
data: {source: synthetic, projects: 2, length: 120, seed: 3}
task: {lookback: [12], horizon: 4, split: {val: 8, test: 8}, mode: MODE}
models:
  mlp: {hidden_size: 8}
  linear: {}
train: {epochs: 15, lr: 0.003, early_stopping: {patience: 2}REFIT}
seeds: [0, 1]
resources: {retries: 0, pack_size: 2}
"""


def spec_text(mode: str, refit: str) -> str:
    return REFIT.replace("MODE", mode).replace("REFIT", refit)


@pytest.mark.parametrize("mode", ["local", "global"])
def test_every_network_refits_for_its_own_best_epoch_and_says_so(tmp_path, mode):
    (tmp_path / "c.yaml").write_text(spec_text(mode, ", refit: true"))
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "work").run(executor="inline")
    networks = 2 * (2 if mode == "local" else 1)  # seeds x projects (global: one model over both)
    assert (outcome.done, outcome.failed) == (2 * networks, 0)  # linear: as many
    trials = read_trials(tmp_path / "work")
    store = Store.open(tmp_path / "work")
    try:
        details_of = {row.trial_id: store.trial_details(row.trial_id) for row in trials.itertuples()}
    finally:
        store.close()
    refits = []
    for row in trials.itertuples():
        details = details_of[row.trial_id]
        if row.family == "linear":
            assert "refit" not in details["plan"]
            continue
        best = next(h["epoch"] for h in details["history"] if h["val_loss"] == min(e["val_loss"] for e in details["history"]))
        assert details["plan"]["refit"]["value"] == best, row.trial_id
        if mode == "local":  # resources.pack_size 2: a project's two seeds trained as one fused pack, each refit alone
            assert details["plan"]["pack_size"]["value"] == 2
        assert details["timings"]["refit_s"] > 0 and row.val_mae == pytest.approx(details["metrics"]["val"]["mae"]) and row.val_mae != row.mae
        refits.append(best)
    assert len(refits) == networks


def test_refit_is_part_of_a_trials_identity_only_when_on(tmp_path):
    ids = {}
    for name, refit in (("plain", ""), ("off", ", refit: false"), ("on", ", refit: true")):
        (tmp_path / f"{name}.yaml").write_text(spec_text("local", refit))
        ids[name] = [t.trial_id for t in expand(load_campaign(tmp_path / f"{name}.yaml"), ["p000", "p001"])]
    assert ids["plain"] == ids["off"]  # campaigns written before the setting keep their results
    neural = [i for i, t in enumerate(expand(load_campaign(tmp_path / "on.yaml"), ["p000", "p001"])) if t.kind == "neural"]
    assert all(ids["on"][i] != ids["off"][i] for i in neural) and len(neural) == 4
    assert [ids["on"][i] for i in range(8) if i not in neural] == [ids["off"][i] for i in range(8) if i not in neural]  # linear: no refit


def test_a_refit_that_is_not_a_boolean_names_the_field(tmp_path):
    (tmp_path / "c.yaml").write_text(spec_text("local", ", refit: sometimes"))
    with pytest.raises(InputError) as info:
        load_campaign(tmp_path / "c.yaml")
    assert "train.refit" in str(info.value) and "c.yaml:" in str(info.value)


def test_a_packed_trials_duration_counts_its_refit_as_an_unpacked_ones_does(tmp_path, monkeypatch):
    """duration_s of a pack's member: its share of the pack's training plus its own refit and scoring, as a trial
    alone counts its whole attempt (before, the member's refit was left out)."""
    import time

    from gpufill.forecasting import run

    real = run.refit

    def slow_refit(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "refit", slow_refit)  # a pack member's refit too (run.member_result)
    (tmp_path / "c.yaml").write_text(spec_text("local", ", refit: true"))
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "work").run(executor="inline")
    assert (outcome.done, outcome.failed) == (8, 0)
    trials = read_trials(tmp_path / "work")
    packed = trials[trials.family == "mlp"]
    store = Store.open(tmp_path / "work")
    try:
        sizes = [store.trial_details(trial_id)["plan"]["pack_size"]["value"] for trial_id in packed.trial_id]
    finally:
        store.close()
    assert sizes == [2, 2, 2, 2] and (packed.duration_s >= 0.5).all(), packed.duration_s.tolist()
