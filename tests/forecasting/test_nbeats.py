"""The nbeats family (forecasting/models/nbeats.py): shapes, the doubly residual links, the interpretable bases,
and a pack of N-BEATS trainings against the same trainings one at a time (issue 28)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpufill.engine.config import FitConfig
from gpufill.errors import InputError
from gpufill.forecasting.data import load_projects, make_windows
from gpufill.forecasting.data.windows import Split
from gpufill.forecasting.models import build
from gpufill.forecasting.models.nbeats import fourier_basis, trend_basis
from gpufill.forecasting.packs import train_pack
from gpufill.forecasting.recipes import recipe
from gpufill.forecasting.run import run_alone, trial_setup
from gpufill.forecasting.trial import Trial


@pytest.mark.parametrize("stacks", ["generic", "interpretable", "mixed"])
@pytest.mark.parametrize("n_features", [1, 3])
def test_a_window_gives_one_forecast_per_horizon_step(stacks, n_features):
    model = build("nbeats", n_features=n_features, lookback=24, horizon=6, params={"stacks": stacks, "blocks": 4, "width": 16})
    assert model(torch.randn(5, 24, n_features)).shape == (5, 6)
    assert len(model.stack) == 4 and all(len(block.fc) == 4 for block in model.stack)


def test_each_block_reads_what_the_blocks_before_left_and_the_forecasts_add_up():
    torch.manual_seed(0)
    model = build("nbeats", n_features=2, lookback=12, horizon=3, params={"blocks": 3, "width": 8})
    seen: list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = []
    for block in model.stack:
        block.register_forward_hook(lambda _m, args, out: seen.append((args[0].detach(), tuple(o.detach() for o in out))))
    x = torch.randn(4, 12, 2)
    forecast = model(x)
    residual = x[..., 0]
    for block_input, (back, _fore) in seen:
        assert torch.equal(block_input[:, :12], residual)  # the residual of the target channel ...
        assert torch.equal(block_input[:, 12:], x[..., 1:].flatten(1))  # ... beside the covariates, never backcast
        residual = residual - back  # each block's backcast is taken away before the next block reads it
    assert torch.allclose(forecast, sum(fore for _, (_, fore) in seen), atol=1e-6)


def test_the_interpretable_stacks_forecast_a_trend_then_a_season():
    back, fore = trend_basis(3, 24, 8)
    assert back.shape == (4, 24) and fore.shape == (4, 8) and torch.equal(fore[0], torch.ones(8))
    model = build("nbeats", n_features=1, lookback=24, horizon=8, params={"stacks": "interpretable", "blocks": 2, "width": 16})
    trend_block = model.stack[0]
    _, trend = trend_block(torch.randn(6, 24))
    # A cubic over the horizon: its fourth differences vanish.
    assert torch.allclose(torch.diff(trend, n=4, dim=1), torch.zeros(6, 4), atol=1e-4)
    back, fore = fourier_basis(3, 24, 8)
    assert back.shape == (7, 24) and fore.shape == (7, 8)
    gram = back @ back.T / 24  # over one window the harmonics are orthogonal
    assert torch.allclose(gram - torch.diag(torch.diagonal(gram)), torch.zeros(7, 7), atol=1e-5)


@pytest.mark.parametrize(("blocks", "kinds"), [(3, ["generic", "trend", "season"]), (5, ["generic", "generic", "trend", "trend", "season"]),
                                               (6, ["generic", "generic", "trend", "trend", "season", "season"])])
def test_the_mixed_stacks_are_generic_then_trend_then_season_blocks_as_neuralforecasts_default(blocks, kinds):
    model = build("nbeats", n_features=1, lookback=24, horizon=8, params={"stacks": "mixed", "blocks": blocks, "width": 16, "trend_degree": 2, "harmonics": 3})
    trend, season = trend_basis(2, 24, 8), fourier_basis(3, 24, 8)

    def kind(block) -> str:
        if block.fore_basis is None:
            assert block.forecast.out_features == 8 and block.backcast.out_features == 24  # a learned basis: one output per step
            return "generic"
        for name, (back, fore) in (("trend", trend), ("season", season)):
            if torch.equal(block.fore_basis, fore) and torch.equal(block.back_basis, back):
                return name
        raise AssertionError("a fixed basis that is neither the trend's nor the season's")

    assert [kind(block) for block in model.stack] == kinds
    assert model.horizon_basis  # its trend and season blocks forecast horizon steps: a quantile loss is refused, as for interpretable


def test_bad_settings_are_one_input_error_each():
    with pytest.raises(InputError, match="stacks must be one of generic, interpretable, mixed, got 'both'"):
        build("nbeats", n_features=1, lookback=12, horizon=3, params={"stacks": "both"})
    with pytest.raises(InputError, match="blocks must be a whole number >= 2"):
        build("nbeats", n_features=1, lookback=12, horizon=3, params={"stacks": "interpretable", "blocks": 1})
    with pytest.raises(InputError, match="blocks must be a whole number >= 3"):
        build("nbeats", n_features=1, lookback=12, horizon=3, params={"stacks": "mixed", "blocks": 2})


def test_a_quantile_nbeats_gives_five_outputs_per_step_and_the_interpretable_stacks_refuse_the_quantile_loss():
    from gpufill.forecasting.run import build_model

    windows = make_windows(load_projects("synthetic", projects=None)["p000"], 24, 6, Split(val=0.1, test=0.2))
    trial = Trial(trial_id="q", project="p000", family="nbeats", kind="neural", params={"width": 16, "blocks": 2}, train={},
                  seed=0, lookback=24, shape="nbeats")
    assert build_model(trial, windows, "quantile")(windows.x_test[:3]).shape == (3, 6 * 5)
    assert build_model(trial, windows, "mae")(windows.x_test[:3]).shape == (3, 6)
    interpretable = dataclasses.replace(trial, params={"stacks": "interpretable", "blocks": 2})
    with pytest.raises(InputError, match="a basis over the horizon's steps") as caught:
        build_model(interpretable, windows, "quantile")
    assert caught.value.field == "loss" and "stacks: generic" in str(caught.value)


def test_a_pack_of_nbeats_trainings_ends_where_each_ends_alone():
    projects = load_projects("synthetic", projects=None)
    windows = make_windows(projects[sorted(projects)[0]], 24, 6, Split(val=0.1, test=0.2))
    trials = [Trial(trial_id=f"n{seed}", project="p", family="nbeats", kind="neural", params={"width": 32, "blocks": 2}, train={},
                    seed=seed, lookback=24, shape="nbeats") for seed in range(3)]
    setups = {t.trial_id: trial_setup(t, recipe("nbeats"), FitConfig(epochs=2, seed=t.seed, device="cpu", batch_size=32, compile=False,
                                                                      batch_search=False, threads=1, precision="fp32"), threads=1) for t in trials}
    scaled = {t.trial_id: windows for t in trials}
    packed = [make() for _, make in train_pack(trials, scaled, setups, kind=None, reason=None)]
    for trial, result in zip(trials, packed, strict=True):
        alone = run_alone(trial, windows, setups[trial.trial_id])
        for metric, value in alone.metrics["test"].items():
            assert result.metrics["test"][metric] == pytest.approx(value, rel=1e-5), (trial.trial_id, metric)
        assert result.plan["pack_size"]["value"] == 3 and result.plan["scaling"]["value"] == "mean"
