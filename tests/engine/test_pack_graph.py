"""Packs of 64 against plain training, the step's static buffers, and (on a GPU) the whole step
replayed as a CUDA graph against eager steps."""

from __future__ import annotations

import math

import pytest
import torch

from gpufill.engine.config import FitConfig
from gpufill.engine.loop import fit
from gpufill.engine.packs.train import PackMember, fit_pack
from gpufill.forecasting.data import forecast_metrics, load_projects, make_windows
from gpufill.forecasting.task import predict
from gpufill.forecasting.models import registry


def windows(n: int, length: int = 160, lookback: int = 8):
    projects = load_projects("synthetic", n_projects=n, length=length, seed=0)
    return [make_windows(p, lookback, 1) for p in projects.values()]


def build(family: str, ws, seeds, params):
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(registry.build(family, n_features=ws[0].n_features, lookback=ws[0].lookback, horizon=1, params=params))
    return models


def members(ws, seeds, lr=1e-3):
    return [PackMember(train=(w.x_train, w.y_train), val=(w.x_val, w.y_val), lr=lr * (1 + (s % 2)), weight_decay=0.01 * (s % 2), seed=s)
            for w, s in zip(ws, seeds, strict=True)]


@pytest.mark.parametrize(("family", "params"), [("lstm", {"hidden_size": 8}), ("mlp", {"hidden_size": 16})])
def test_a_pack_of_64_trains_every_member_as_plain_training_does(family, params):
    """Different projects, lrs, weight decays and seeds; 76 windows each, so a short last batch. (At lr 1e-2 some
    members drift apart by 1e-3 in epoch 2: Adam turns rounding noise in near-zero gradients into
    full-size steps, whichever side computes them; at the default lr they agree to 1e-4.)"""
    ws = windows(64, length=120)
    seeds = list(range(64))
    # One thread on both sides: 65 trainings of tiny steps gain nothing from a second one, and on a busy CPU (the other
    # pytest-xdist worker) its waits made them 10-30 s instead of 1 s; the comparison holds at any thread count.
    config = FitConfig(epochs=2, batch_size=32, device="cpu", precision="fp32", threads=1)
    packed = fit_pack(build(family, ws, seeds, params), members(ws, seeds), config=config)
    assert len(packed) == 64 and packed[0].timings["pack_size"] == 64
    for w, seed, member, result in zip(ws, seeds, members(ws, seeds), packed, strict=True):
        torch.manual_seed(seed)
        model = registry.build(family, n_features=w.n_features, lookback=w.lookback, horizon=1, params=params)
        plain = fit(model, (w.x_train, w.y_train), (w.x_val, w.y_val),
                    config=FitConfig(epochs=2, batch_size=32, device="cpu", precision="fp32", lr=member.lr, weight_decay=member.weight_decay, seed=seed,
                                     threads=1))
        metrics = {key: (result.metrics[key], plain.metrics[key]) for key in ("train_loss", "val_loss")}
        metrics["test_mae"] = tuple(forecast_metrics(w.test_truth, w.inverse_target(predict(m, w.x_test)), w.mase_scale)["mae"] for m in (result.model, plain.model))
        for key, (fused_value, plain_value) in metrics.items():
            assert math.isclose(fused_value, plain_value, rel_tol=1e-4), (seed, key, fused_value, plain_value)


def test_the_last_short_batch_is_padded_with_masked_columns_and_the_plan_says_how_steps_run():
    ws = windows(3, length=130)
    seeds = [0, 1, 2]
    config = FitConfig(epochs=1, batch_size=32, device="cpu", precision="fp32")
    result = fit_pack(build("mlp", ws, seeds, {"hidden_size": 8}), members(ws, seeds), config=config)
    plan = result[0].plan
    assert plan.step_graph.value is False and "CUDA" in plan.step_graph.reason
    assert plan.optimizer_kernel.value == "fused" and "flat (K, P) buffer" in plan.optimizer_kernel.reason
    assert {r.metrics["epochs_run"] for r in result} == {1}


# --- GPU -------------------------------------------------------------------------------------


def _pack_weights(results):
    return [torch.cat([t.detach().float().flatten() for t in r.model.state_dict().values()]) for r in results]


@pytest.mark.gpu
@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-5), ("bf16", 2e-2)])
@pytest.mark.parametrize("family", ["lstm", "gru", "tcn", "transformer"])
def test_graph_replayed_steps_equal_eager_steps(family, precision, atol):
    params = {"lstm": {"hidden_size": 32}, "gru": {"hidden_size": 32}, "tcn": {"channels": 16}, "transformer": {"d_model": 32, "nhead": 4, "num_layers": 1}}[family]
    ws = windows(8, length=400, lookback=12)
    seeds = list(range(8))
    runs = {}
    for graph in (False, True):
        config = FitConfig(epochs=4, batch_size=64, device="cuda", precision=precision, cuda_graph=graph, compile=False, tf32=False)
        runs[graph] = fit_pack(build(family, ws, seeds, params), members(ws, seeds), config=config)
    assert runs[True][0].plan.step_graph.value, runs[True][0].plan.step_graph.reason
    assert not runs[False][0].plan.step_graph.value
    assert math.ceil(max(w.x_train.shape[0] for w in ws) / 64) * 4 >= 20  # at least 20 replayed steps
    for eager, replayed in zip(_pack_weights(runs[False]), _pack_weights(runs[True]), strict=True):
        torch.testing.assert_close(replayed, eager, rtol=0, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["linear", "warmup_cosine"])
def test_a_scheduled_packs_replayed_steps_follow_each_members_schedule_as_eager_steps_do(schedule):
    """The lr factor is computed on the device inside the captured step: replays move it as eager steps do (members
    of different lengths: each its own schedule), and every member ends its schedule at 0."""
    ws = windows(4, length=400, lookback=12) + windows(2, length=250, lookback=12)
    seeds = list(range(6))
    runs = {}
    for graph in (False, True):
        config = FitConfig(epochs=4, batch_size=64, device="cuda", precision="fp32", cuda_graph=graph, compile=False, tf32=False,
                           patience=None, restore_best=False, schedule=schedule)
        runs[graph] = fit_pack(build("lstm", ws, seeds, {"hidden_size": 16}), members(ws, seeds), config=config)
    assert runs[True][0].plan.step_graph.value, runs[True][0].plan.step_graph.reason
    for eager, replayed in zip(runs[False], runs[True], strict=True):
        assert [h.lr for h in replayed.history] == pytest.approx([h.lr for h in eager.history], rel=1e-9)
        assert replayed.history[-1].lr == pytest.approx(0.0, abs=1e-12)
    for eager, replayed in zip(_pack_weights(runs[False]), _pack_weights(runs[True]), strict=True):
        torch.testing.assert_close(replayed, eager, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_early_stopping_and_divergence_masking_work_under_replay():
    ws = windows(4, length=400, lookback=12)
    seeds = [0, 1, 2, 3]
    pack_members = members(ws, seeds)
    pack_members[1] = PackMember(train=pack_members[1].train, val=pack_members[1].val, lr=1e30, weight_decay=0.0, seed=1)  # diverges: weights ~1e30 overflow the head's output
    outcomes = {}
    for graph in (False, True):
        config = FitConfig(epochs=30, batch_size=64, device="cuda", precision="fp32", cuda_graph=graph, compile=False, tf32=False, patience=2)
        results = fit_pack(build("lstm", ws, seeds, {"hidden_size": 16}), pack_members, config=config)
        outcomes[graph] = [(r.status, r.metrics["epochs_run"], r.metrics["best_epoch"]) for r in results]
    assert outcomes[True] == outcomes[False]
    assert outcomes[True][1][0] == "diverged" and any(status == "early_stopped" for status, _, _ in outcomes[True])


@pytest.mark.gpu
def test_a_pack_re_formed_under_replay_recaptures_its_step_and_trains_as_the_masked_pack():
    """On a GPU the smaller pack captures its own step graph; its survivors end where the masked pack's end (1e-5)."""
    ws = windows(6, length=400, lookback=12)
    seeds = list(range(6))
    outcomes = {}
    for reform in ("never", "always"):
        pack_members = members(ws, seeds)
        for i in (1, 4):
            pack_members[i] = PackMember(train=pack_members[i].train, val=pack_members[i].val, lr=pack_members[i].lr, weight_decay=0.0, seed=i,
                                         watch=lambda epoch, predictions: "pruned" if epoch == 2 else None)
        config = FitConfig(epochs=5, batch_size=64, device="cuda", precision="fp32", cuda_graph=True, compile=False, tf32=False, patience=None)
        outcomes[reform] = fit_pack(build("lstm", ws, seeds, {"hidden_size": 16}), pack_members, config=config, reform=reform)
    reformed = outcomes["always"]
    assert reformed[0].plan.step_graph.value and any("pack re-formed after epoch 2" in e for e in reformed[0].events)
    assert sum(e.startswith("step graph:") for e in reformed[0].events) == 2  # the full pack's capture, then the smaller pack's
    assert [r.status for r in reformed] == [r.status for r in outcomes["never"]]
    for masked, again in zip(_pack_weights(outcomes["never"]), _pack_weights(reformed), strict=True):
        torch.testing.assert_close(again, masked, rtol=0, atol=1e-5)


class UsersForecaster(torch.nn.Module):
    """A user's own forecaster (no hand-written fused twin): the pack is torch.func's vmap of it."""

    def __init__(self, n_features: int, lookback: int):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n_features * lookback, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                        torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


def test_a_users_model_packs_through_torch_func_and_trains_as_it_does_alone():
    ws = windows(6, length=140)
    seeds = list(range(6))
    config = FitConfig(epochs=2, batch_size=32, device="cpu", precision="fp32")

    def users(seed):
        torch.manual_seed(seed)
        return UsersForecaster(ws[0].n_features, ws[0].lookback)

    packed = fit_pack([users(s) for s in seeds], members(ws, seeds), config=config)
    assert "trained in a pack of 6 (torch.func vmap)" in packed[0].events
    for w, seed, member, result in zip(ws, seeds, members(ws, seeds), packed, strict=True):
        plain = fit(users(seed), (w.x_train, w.y_train), (w.x_val, w.y_val),
                    config=FitConfig(epochs=2, batch_size=32, device="cpu", precision="fp32", lr=member.lr, weight_decay=member.weight_decay, seed=seed))
        assert math.isclose(result.metrics["val_loss"], plain.metrics["val_loss"], rel_tol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-5), ("bf16", 2e-2)])
def test_a_users_models_pack_replayed_as_a_graph_equals_eager_steps(precision, atol):
    ws = windows(8, length=400, lookback=12)
    seeds = list(range(8))
    runs = {}
    for graph in (False, True):
        models = []
        for seed in seeds:
            torch.manual_seed(seed)
            models.append(UsersForecaster(ws[0].n_features, ws[0].lookback))
        config = FitConfig(epochs=4, batch_size=64, device="cuda", precision=precision, cuda_graph=graph, compile=False, tf32=False)
        runs[graph] = fit_pack(models, members(ws, seeds), config=config)
    assert runs[True][0].plan.step_graph.value, runs[True][0].plan.step_graph.reason
    for eager, replayed in zip(_pack_weights(runs[False]), _pack_weights(runs[True]), strict=True):
        torch.testing.assert_close(replayed, eager, rtol=0, atol=atol)
