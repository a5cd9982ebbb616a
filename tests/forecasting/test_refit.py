"""train.refit: once early stopping has chosen a network's length on validation, it trains again from its initial
weights on training + validation for that many epochs and the test forecast is the refit's; the validation scores
stay the first training's. Equivalence first: a refit is exactly the plain training on the folded windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpufill.engine.config import FitConfig
from gpufill.forecasting.data import load_projects, make_windows
from gpufill.forecasting.data.windows import Split
from gpufill.forecasting.packs import train_pack
from gpufill.forecasting.recipes import recipe
from gpufill.forecasting.run import REFIT_REASON, run_alone, run_global, trial_setup
from gpufill.forecasting.trial import GLOBAL_PROJECT, Trial

SPLIT = Split(val=16, test=16)


@pytest.fixture(scope="module")
def cuts():
    """Two synthetic projects cut with a validation region, and the same cut with it folded into training."""
    loaded = load_projects("synthetic", projects=None)
    names = sorted(loaded)[:2]
    return ({name: make_windows(loaded[name], 12, 4, SPLIT) for name in names},
            {name: make_windows(loaded[name], 12, 4, dataclasses.replace(SPLIT, val=0)) for name in names})


def trial(seed: int = 0, project: str = "p000", lr: float = 3e-3) -> Trial:
    return Trial(trial_id=f"mlp-{project}-{seed}-{lr}", project=project, family="mlp", kind="neural", params={"hidden_size": 8},
                 train={"lr": lr}, seed=seed, lookback=12, shape="s")


def setup_of(t: Trial, *, epochs: int = 30, patience: int | None = 2, refit: bool = False):
    # Every setting that changes numbers pinned, none timed (a loaded box timed the for-loop optimizer faster once, and
    # its last bits moved a pack member's early stop by an epoch against the same trial alone)
    config = FitConfig(epochs=epochs, patience=patience, lr=t.train["lr"], seed=t.seed, device="cpu", batch_size=16, compile=False,
                       batch_search=False, threads=1, precision="fp32", optimizer_kernel="fused", probe=False)
    return trial_setup(t, recipe(t.family), config, threads=1, refit=refit)


def forecast(result, project: str) -> np.ndarray:
    return np.asarray(result.forecasts[project]["forecast"])


def test_a_refit_is_the_plain_training_on_training_and_validation_for_the_epochs_the_stop_chose(cuts):
    windows, folded = cuts
    t = trial()
    refitted = run_alone(t, windows["p000"], setup_of(t, refit=True), folded=folded["p000"])
    first = run_alone(t, windows["p000"], setup_of(t))
    best = first.metrics["fit_best_epoch"]
    assert 1 <= best < 30 and first.status == "early_stopped"  # a length chosen by the stop, not the budget
    plain = run_alone(t, folded["p000"], setup_of(t, epochs=best, patience=None))
    np.testing.assert_allclose(forecast(refitted, "p000"), forecast(plain, "p000"), rtol=1e-5, atol=1e-6)
    assert refitted.metrics["test"]["mae"] == pytest.approx(plain.metrics["test"]["mae"], rel=1e-5)
    assert not np.allclose(forecast(refitted, "p000"), forecast(first, "p000"))  # the refit, not the first training, forecasts the test
    # Validation is the first training's: it never saw the validation targets.
    assert refitted.metrics["val"] == first.metrics["val"] and refitted.val_forecasts == first.val_forecasts
    assert refitted.plan["refit"] == {"value": best, "reason": REFIT_REASON} and refitted.metrics["fit_refit_epochs"] == best
    assert "refit" not in first.plan and "refit_s" not in first.timings
    assert refitted.timings["train_s"] == pytest.approx(first.timings["train_s"] + refitted.timings["refit_s"], rel=0.5)
    assert refitted.timings["refit_s"] > 0 and any("refit on training + validation" in e for e in refitted.events)


def test_without_a_refit_setting_or_a_validation_window_nothing_trains_twice(cuts):
    windows, folded = cuts
    t = trial()
    off = run_alone(t, windows["p000"], setup_of(t, refit=False), folded=folded["p000"])
    assert "refit" not in off.plan
    no_stop = run_alone(t, folded["p000"], setup_of(t, epochs=3, refit=True), folded=folded["p000"])  # no validation: no length chosen
    assert "refit" not in no_stop.plan and no_stop.metrics["fit_best_epoch"] is None


@pytest.mark.slow
def test_a_pack_member_refits_to_the_trial_refitted_alone(cuts):
    windows, folded = cuts
    members = [trial(0), trial(1, lr=1e-2)]
    setups = {t.trial_id: setup_of(t, refit=True) for t in members}
    packed = [make() for _, make in train_pack(members, {t.trial_id: windows["p000"] for t in members}, setups, kind=None, reason=None,
                                               folded={t.trial_id: folded["p000"] for t in members})]
    for t, result in zip(members, packed, strict=True):
        alone = run_alone(t, windows["p000"], setups[t.trial_id], folded=folded["p000"])
        assert result.plan["refit"]["value"] == alone.plan["refit"]["value"]
        np.testing.assert_allclose(forecast(result, "p000"), forecast(alone, "p000"), rtol=1e-4, atol=1e-5)


def test_a_global_refit_trains_once_over_every_project_folded(cuts):
    windows, folded = cuts
    t = dataclasses.replace(trial(), project=GLOBAL_PROJECT)
    names = sorted(windows)
    refitted = run_global(t, [windows[n] for n in names], setup_of(t, refit=True), folded=[folded[n] for n in names])
    best = refitted.plan["refit"]["value"]
    plain = run_global(t, [folded[n] for n in names], setup_of(t, epochs=best, patience=None))
    for name in names:
        np.testing.assert_allclose(forecast(refitted, name), forecast(plain, name), rtol=1e-5, atol=1e-6)
        assert refitted.metrics["per_project"][name]["test"]["mae"] == pytest.approx(plain.metrics["per_project"][name]["test"]["mae"], rel=1e-5)
    first = run_global(t, [windows[n] for n in names], setup_of(t))
    assert refitted.metrics["val"] == first.metrics["val"] and best == len(first.history) - 2  # patience 2: the stop's best


def test_a_refit_that_diverges_fails_the_trial(cuts, monkeypatch):
    """The test forecast is the refit's: where the refit diverged, the trial is diverged (a campaign records it failed),
    not scored on the first training's forecast under settings that say refit."""
    import gpufill.forecasting.run as run

    windows, folded = cuts
    real, calls = run.fit, []

    def second_diverges(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result)
        return dataclasses.replace(result, status="diverged", events=[*result.events, "loss nan"]) if len(calls) == 2 else result

    monkeypatch.setattr(run, "fit", second_diverges)
    t = trial()
    result = run_alone(t, windows["p000"], setup_of(t, refit=True), folded=folded["p000"])
    assert len(calls) == 2 and calls[0].status == "early_stopped"
    assert result.status == "diverged" and result.diverged and "refit: loss nan" in result.events
