"""Selection without peeking (issue 28): a summary chooses each family's configuration on the validation window,
and the test score it shows is that configuration's; without a validation window it says it chose on the test."""

from __future__ import annotations

from gpufill.campaign.results.reading import CHOSEN_ON_TEST, CHOSEN_ON_VALIDATION, best_per_project, read_best, read_trials
from gpufill.campaign.run.runner import Campaign


def campaign(tmp_path, val: int) -> Campaign:
    path = tmp_path / "select.yaml"
    path.write_text("\n".join([
        "name: select",
        "data: {source: synthetic, projects: 2, length: 240, seed: 5}",  # on p001 validation and test prefer different lookbacks
        f"task: {{lookback: [6, 24], horizon: 3, split: {{val: {val}, test: 30}}}}",
        "models:",
        "  mlp: {hidden_size: 16}",
        "  linear: {}",
        "train: {epochs: 3, early_stopping: null}",
        "seeds: [0, 1]",
        "resources: {retries: 0}",
    ]) + "\n")
    return Campaign.from_yaml(path, tmp_path / "work")


def test_a_lookback_chosen_on_validation_is_the_one_whose_test_score_is_shown(tmp_path):
    run = campaign(tmp_path, val=30)
    assert run.run(executor="inline").failed == 0
    trials = read_trials(tmp_path / "work")
    mlp = trials[trials["family"] == "mlp"]
    assert trials["val_mae"].notna().all()  # classical too: fitted on train for its validation score (issue 38)
    differs = 0
    for row in read_best(tmp_path / "work"):
        if row["family"] != "mlp":
            linear = trials[(trials["family"] == "linear") & (trials["project"] == row["project"])].groupby("lookback")["val_mae"].mean()
            assert row["chosen_on"] == CHOSEN_ON_VALIDATION and row["lookback"] == linear.idxmin()
            continue
        mine = mlp[mlp["project"] == row["project"]]
        by_lookback = mine.groupby("lookback")[["val_mae", "mae"]].mean()
        assert row["chosen_on"] == CHOSEN_ON_VALIDATION
        assert row["lookback"] == by_lookback["val_mae"].idxmin()  # chosen on validation ...
        assert abs(row["mae"] - by_lookback.loc[row["lookback"], "mae"]) < 1e-9  # ... and its own test score shown
        differs += by_lookback["mae"].idxmin() != row["lookback"]
    assert differs == 1  # one project's best test score belongs to another lookback: it was not chosen (no peeking)
    frame = best_per_project(trials)  # the report's path agrees with the summary's
    assert sorted(zip(frame["project"], frame["family"], frame["lookback"], frame["chosen_on"])) == sorted(
        (r["project"], r["family"], r["lookback"], r["chosen_on"]) for r in read_best(tmp_path / "work"))


def test_without_a_validation_window_the_summary_says_it_chose_on_the_test(tmp_path):
    assert campaign(tmp_path, val=0).run(executor="inline").failed == 0
    rows = read_best(tmp_path / "work")
    assert {r["chosen_on"] for r in rows} == {CHOSEN_ON_TEST} and len(rows) == 4
    trials = read_trials(tmp_path / "work")
    for row in rows:  # the best test score, as before, and labelled so
        mine = trials[(trials["project"] == row["project"]) & (trials["family"] == row["family"])]
        assert abs(row["mae"] - mine.groupby("lookback")["mae"].mean().min()) < 1e-9
