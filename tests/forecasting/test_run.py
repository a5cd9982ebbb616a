"""forecasting/run.py and packs.py: one trial's run, alone, in a pack and global, through one seeded builder and one
result builder (issue 27: "run one trial" has one owner)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gpufill.engine.config import FitConfig
from gpufill.forecasting.data import load_projects, make_windows
from gpufill.forecasting.data.windows import Split
from gpufill.forecasting.packs import train_pack
from gpufill.forecasting.recipes import recipe
from gpufill.forecasting.run import build_model, run_alone, run_global, trial_setup
from gpufill.forecasting.trial import GLOBAL_PROJECT, PackEntry, Trial, TrialResult, trial_result


@pytest.fixture(scope="module")
def projects():
    loaded = load_projects("synthetic", projects=None)
    return {name: make_windows(loaded[name], 12, 1, Split(val=0.1, test=0.2)) for name in sorted(loaded)[:2]}


def trial(seed: int = 0, project: str = "p000", family: str = "mlp", kind: str = "neural", lr: float = 1e-3) -> Trial:
    return Trial(trial_id=f"{family}-{project}-{seed}-{lr}", project=project, family=family, kind=kind, params={"hidden_size": 8},
                 train={"lr": lr}, seed=seed, lookback=12, shape="s")


def setup_of(t: Trial, epochs: int = 2):
    # fp32 asked for: on a CPU with bf16 a trial trained alone could measure bf16 faster on its first steps (live.py).
    return trial_setup(t, recipe(t.family), FitConfig(epochs=epochs, lr=t.train["lr"], seed=t.seed, device="cpu", batch_size=32,
                                                      compile=False, batch_search=False, threads=1, precision="fp32"), threads=1)


def test_one_builder_seeds_every_way_a_trial_trains(projects):
    windows = next(iter(projects.values()))
    first, again, other = build_model(trial(3), windows), build_model(trial(3), windows), build_model(trial(4), windows)
    for a, b, c in zip(first.parameters(), again.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, c) for a, c in zip(first.parameters(), other.parameters(), strict=True))


def test_a_pack_member_ends_where_the_trial_ends_alone(projects):
    name = next(iter(projects))
    windows = projects[name]
    members = [trial(0, name), trial(1, name, lr=3e-3)]
    setups = {t.trial_id: setup_of(t) for t in members}
    packed = [make() for _, make in train_pack(members, {t.trial_id: windows for t in members}, setups, kind=None, reason=None)]
    for t, result in zip(members, packed, strict=True):
        alone = run_alone(t, windows, setups[t.trial_id])
        for metric, value in alone.metrics["test"].items():
            assert result.metrics["test"][metric] == pytest.approx(value, rel=1e-4), (t.trial_id, metric)
        assert result.plan["pack_size"]["value"] == 2 and alone.plan["pack_size"] == {"value": 1, "reason": "one model, trained alone"}
        assert result.plan["loss"] == alone.plan["loss"] == {"value": "mae", "reason": recipe("mlp").why["loss"]}


def test_a_global_trial_is_scored_per_project_and_averaged(projects):
    t = dataclasses.replace(trial(), project=GLOBAL_PROJECT)
    result = run_global(t, list(projects.values()), setup_of(t, epochs=1))
    per = result.metrics["per_project"]
    assert sorted(per) == sorted(projects) and set(result.forecasts) == set(projects)
    assert result.metrics["test"]["mae"] == pytest.approx(sum(p["test"]["mae"] for p in per.values()) / len(per))
    assert result.plan["scaling"]["value"] == "last"  # the mlp's recipe, recorded by the one builder


def test_the_result_builder_records_recipe_pack_and_memory_and_the_result_is_frozen():
    t = trial()
    result = trial_result(t, status="completed", plan={"device": {"value": "cpu", "reason": "r"}}, metrics={"test": {"mae": 1.0}},
                          timings={"train_s": 2.0}, recipe=recipe("mlp"), pack=PackEntry(4, "measured"), peak_memory_bytes=123)
    assert list(result.plan) == ["device", "scaling", "loss", "schedule", "pack_size"]
    assert result.plan["pack_size"] == {"value": 4, "reason": "measured"}
    assert result.timings == {"train_s": 2.0, "peak_memory_bytes": 123} and result.params == {"hidden_size": 8}
    classical = trial_result(dataclasses.replace(t, family="rf", kind="classical"), status="completed", plan={}, metrics={}, timings={}, recipe=recipe("rf"))
    assert list(classical.plan) == ["scaling"]  # a classical model has no loss or schedule
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "diverged"  # type: ignore[misc]
    assert isinstance(result, TrialResult) and result.to_message()["plan"] is result.plan


@pytest.mark.parametrize("scaling", ["project", "last", "standard", "mean", "raw"])
@pytest.mark.parametrize("metric", ["mae", "rmse", "smape", "mase"])
def test_the_validation_scorer_matches_scoring_each_project_on_its_own(projects, scaling, metric):
    """A search's pruner scores every epoch through one joined forward (ValidationScorer): the same number as scoring
    each project's validation windows alone and averaging, as a global trial's stored score is."""
    import statistics

    from gpufill.forecasting.data.window_scaling import scale_windows
    from gpufill.forecasting.run import ValidationScorer, validation

    windows = [scale_windows(w, scaling) for w in projects.values()]
    model = build_model(trial(5), windows[0])
    alone = statistics.fmean(validation(model, w, None)[0][metric] for w in windows)
    assert ValidationScorer(windows, metric)(model) == pytest.approx(alone, rel=1e-9)
    assert alone > 0


@pytest.mark.parametrize("scaling", ["last", "mean"])
def test_a_global_models_forecasts_in_one_pass_match_each_projects_own(projects, scaling):
    """run_global forecasts every project's test and validation windows in one pass (task.forecasts_of): the same
    forecasts, in the data's units, as forecasting each project's windows alone, and the same validation scores."""
    from gpufill.forecasting.data.window_scaling import scale_windows
    from gpufill.forecasting.run import validation, validation_of_each
    from gpufill.forecasting.task import forecast_of, forecasts_of

    windows = [scale_windows(w, scaling) for w in projects.values()]
    model = build_model(trial(5), windows[0])
    joined = forecasts_of(model, windows, "test", None)
    assert len(joined) == len(windows) == 2
    for w, (point, quantiles) in zip(windows, joined, strict=True):
        alone, _ = forecast_of(model, w, w.x_test, "test", None)
        assert point.shape == alone.shape == (w.x_test.shape[0], w.horizon) and quantiles is None
        np.testing.assert_allclose(point, alone, rtol=1e-5)
    for w, scored in zip(windows, validation_of_each(model, windows, None), strict=True):
        metrics, kept = validation(model, w, None)
        assert scored[0] == pytest.approx(metrics, rel=1e-5)
        np.testing.assert_allclose(scored[1]["forecast"], kept["forecast"], rtol=1e-5)
