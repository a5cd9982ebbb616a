"""`train: {max_steps: N}` in a campaign: every network's training ends at N optimizer steps whatever its data's size
(a schedule decays over them), a refit trains at most as many, a family's variant may set its own budget, and the
setting is part of a trial's identity only when set, so older campaigns keep their ids."""

from __future__ import annotations

import pytest

from gpufill.campaign import expand, load_campaign
from gpufill.campaign.results.reading import read_trials
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError

BUDGET = """name: budget
data: {source: synthetic, projects: 2, length: 120, seed: 3}
task: {lookback: [12], horizon: 4, split: {val: 8, test: 8}, mode: global}
models:
  mlp: {hidden_size: 8}
  mlp@short: {hidden_size: 8, max_steps: 3}
train: {epochs: 15, lr: 0.003, schedule: linear, early_stopping: null, refit: trueBUDGET}
seeds: [0]
resources: {retries: 0}
"""


def stored(workdir) -> list[tuple[str, dict]]:
    """(family, stored details) of each trial of the workdir."""
    trials = read_trials(workdir)
    store = Store.open(workdir)
    try:
        return [(row.family, store.trial_details(row.trial_id)) for row in trials.itertuples()]
    finally:
        store.close()


def test_each_training_ends_at_its_step_budget_and_its_refit_trains_no_more(tmp_path):
    (tmp_path / "c.yaml").write_text(BUDGET.replace("BUDGET", ", max_steps: 7"))
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "work").run(executor="inline")
    assert (outcome.done, outcome.failed) == (2, 0)
    trained = dict(stored(tmp_path / "work"))
    shapes = {t.family: t.shape for t in expand(load_campaign(tmp_path / "c.yaml"), ["p000", "p001"])}
    assert "refit: stopped at max_steps 7 in epoch 1" in " ".join(trained["mlp"]["events"])  # its 2 epochs of more windows: cut at 7
    for family, budget in (("mlp", 7), ("mlp@short", 3)):
        steps = [epoch["steps"] for epoch in trained[family]["history"]]
        assert sum(steps) == budget and len(steps) < 15, (family, steps)  # ended by the budget, not by its 15 epochs
        assert trained[family]["history"][-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # the linear decay spans the budget, not 15 epochs
        assert f"max_steps={budget}" in shapes[family]  # trainings of other lengths never share a pack
        refit = [event for event in trained[family]["events"] if event.startswith("refit on training + validation")]
        assert len(refit) == 1 and trained[family]["plan"]["refit"]["value"] <= len(steps)
        assert any(event.startswith(f"stopped at max_steps {budget}") for event in trained[family]["events"])


def test_a_step_budget_is_part_of_a_trials_identity_only_when_set(tmp_path):
    ids = {}
    for name, budget in (("plain", ""), ("null", ", max_steps: null"), ("set", ", max_steps: 7")):
        (tmp_path / f"{name}.yaml").write_text(BUDGET.replace("BUDGET", budget).replace("  mlp@short: {hidden_size: 8, max_steps: 3}\n", ""))
        ids[name] = [t.trial_id for t in expand(load_campaign(tmp_path / f"{name}.yaml"), ["p000", "p001"])]
    assert ids["plain"] == ids["null"] and len(ids["plain"]) == 1  # campaigns written before the setting keep their results
    assert ids["set"] != ids["plain"]


@pytest.mark.parametrize("budget", ["0", "-3", "1.5", "many"])
def test_a_step_budget_that_is_not_a_positive_count_names_the_field(tmp_path, budget):
    (tmp_path / "c.yaml").write_text(BUDGET.replace("BUDGET", f", max_steps: {budget}"))
    with pytest.raises(InputError) as info:
        load_campaign(tmp_path / "c.yaml")
    assert "train.max_steps" in str(info.value) and "c.yaml" in str(info.value)


def test_a_fused_packs_members_each_end_at_the_budget(tmp_path):
    """Local mode, two seeds of a project trained as one fused pack (resources.pack_size 2): each member's epochs
    add up to the budget, as an unpacked training's do, its linear schedule decayed to 0 over the budget."""
    text = (BUDGET.replace("BUDGET", ", max_steps: 5").replace("mode: global", "mode: local").replace("seeds: [0]", "seeds: [0, 1]")
            .replace("  mlp@short: {hidden_size: 8, max_steps: 3}\n", "").replace("resources: {retries: 0}", "resources: {retries: 0, pack_size: 2}"))
    (tmp_path / "c.yaml").write_text(text)
    outcome = Campaign.from_yaml(tmp_path / "c.yaml", tmp_path / "work").run(executor="inline")
    assert (outcome.done, outcome.failed) == (4, 0)  # 2 projects x 2 seeds
    trained = [details for _, details in stored(tmp_path / "work")]
    assert [sum(epoch["steps"] for epoch in t["history"]) for t in trained] == [5, 5, 5, 5]
    assert all(t["plan"]["pack_size"]["value"] == 2 and t["plan"]["schedule"]["value"] == "linear" for t in trained)
    assert [t["history"][-1]["lr"] for t in trained] == pytest.approx([0.0] * 4, abs=1e-12)  # each decayed over its own 5 steps
