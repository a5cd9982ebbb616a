"""Fused LSTM / GRU packs: model k of a pack computes, differentiates and trains like plain model k."""

from __future__ import annotations

import pytest
import torch

from gpufill.errors import InputError
from gpufill.engine.packs.fused import fuse
from gpufill.forecasting.models.fused_recurrent import FusedGRU, FusedLSTM
from gpufill.forecasting.models.neural import GRUForecaster, LSTMForecaster
from gpufill.forecasting.models.registry import build

FAMILIES = {"lstm": (LSTMForecaster, FusedLSTM), "gru": (GRUForecaster, FusedGRU)}
K = 3
ATOL = 1e-5


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread is as fast, and immune to other processes on the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plain_models(family: str, k: int = K, *, lookback: int = 12, **params) -> list[torch.nn.Module]:
    """K plain models, model i initialised from seed i."""
    models = []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(
            build(family, n_features=3, lookback=lookback, horizon=2, params={"hidden_size": 8, **params})
        )
    return models


def batches(k: int = K, batch: int = 5, lookback: int = 12, seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """One (batch, lookback, 3) input and (batch, 2) target per model, stacked on a leading K."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(k, batch, lookback, 3, generator=gen)
    x[..., 0] += 2.0  # a target level away from zero, so last-value normalisation matters
    return x, torch.randn(k, batch, 2, generator=gen)


def per_model_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(K,) mean squared error of each model on its own batch."""
    return ((out - y) ** 2).mean(dim=(1, 2))


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters()}


# --- structure -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_state_dict_has_the_plain_names_with_a_leading_k(family, num_layers):
    models = plain_models(family, num_layers=num_layers)
    fused = fuse(models)
    assert type(fused) is FAMILIES[family][1]
    plain_state = models[0].state_dict()
    fused_state = fused.state_dict()
    assert list(fused_state) == list(plain_state)  # same names, same order
    assert len(fused_state) == 4 * num_layers + 2
    for name, tensor in plain_state.items():
        assert fused_state[name].shape == (K, *tensor.shape)


@pytest.mark.parametrize("family", FAMILIES)
def test_unfuse_round_trip_gives_the_plain_models_back(family):
    models = plain_models(family, num_layers=2)
    fused = fuse(models)
    x, _ = batches()
    for k, model in enumerate(models):
        plain = fused.unfuse(k)
        assert type(plain) is FAMILIES[family][0]
        assert plain.state_dict().keys() == model.state_dict().keys()
        assert all(torch.equal(plain.state_dict()[n], t) for n, t in model.state_dict().items())
        torch.testing.assert_close(plain(x[k]), model(x[k]), rtol=0, atol=0)


def test_wrong_input_shape_is_refused_with_the_fix():
    fused = fuse(plain_models("lstm"))
    with pytest.raises(InputError, match=r"pack of 3 expects input \(K=3, batch, lookback, 3\)"):
        fused(torch.randn(2, 5, 12, 3))


# --- forward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("last_value_norm", [True, False])
def test_forward_matches_each_plain_model(family, num_layers, last_value_norm):
    models = plain_models(family, num_layers=num_layers, last_value_norm=last_value_norm)
    fused = fuse(models)
    x, _ = batches()
    out = fused(x)
    assert out.shape == (K, 5, 2)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model(x[k]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("batch", "lookback"), [(1, 1), (2, 2), (4, 40)])
def test_forward_matches_at_edge_lengths(family, batch, lookback):
    """One step (no recurrence at all), two steps (one), and a long window."""
    models = plain_models(family, num_layers=2, lookback=lookback)
    x, _ = batches(batch=batch, lookback=lookback)
    out = fuse(models)(x)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model(x[k]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_dropout_acts_in_training_and_not_in_eval(family):
    models = plain_models(family, num_layers=2, dropout=0.5)
    fused = fuse(models)
    x, _ = batches()
    fused.eval()
    for model in models:
        model.eval()
    out = fused(x)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model(x[k]), rtol=0, atol=ATOL)
    fused.train()
    torch.manual_seed(0)
    dropped = fused(x)
    # masks differ between calls and from eval: the dropout layers are live
    assert (dropped - out).abs().amax(dim=(1, 2)).min() > 1e-3
    assert (fused(x) - dropped).abs().amax() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_autocast_stays_close_to_fp32(family):
    """Under autocast the matmuls run in bf16 and the state follows their dtype (torch.lerp wants one)."""
    fused = fuse(plain_models(family, num_layers=2))
    x, y = batches()
    reference = fused(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused(x)
        loss = per_model_mse(out, y).sum()
    loss.backward()
    torch.testing.assert_close(out.float(), reference, rtol=0, atol=0.05)
    assert all(torch.isfinite(p.grad).all() and p.grad.abs().max() > 0 for p in fused.parameters())


# --- gradients -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("last_value_norm", [True, False])
def test_gradients_match_each_plain_model(family, last_value_norm):
    models = plain_models(family, num_layers=2, last_value_norm=last_value_norm)
    fused = fuse(models)
    x, y = batches()
    per_model_mse(fused(x), y).sum().backward()
    fused_grads = grads(fused)
    assert fused_grads.keys() == dict(models[0].named_parameters()).keys()
    for k, model in enumerate(models):
        ((model(x[k]) - y[k]) ** 2).mean().backward()
        for name, grad in grads(model).items():
            assert grad.abs().max() > 0, name  # every parameter is reached
            torch.testing.assert_close(fused_grads[name][k], grad, rtol=0, atol=ATOL, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_model_k_gradients_do_not_see_other_models_inputs(family):
    fused = fuse(plain_models(family, num_layers=2))
    x, y = batches()
    per_model_mse(fused(x), y).sum().backward()
    before = grads(fused)
    fused.zero_grad(set_to_none=True)
    x2, y2 = x.clone(), y.clone()
    x2[1] = torch.randn_like(x2[1]) * 5  # only model 1's batch changes
    y2[1] += 3.0
    per_model_mse(fused(x2), y2).sum().backward()
    after = grads(fused)
    for name in before:
        for k in (0, 2):
            assert torch.equal(after[name][k], before[name][k]), (name, k)
        assert not torch.allclose(after[name][1], before[name][1]), name


# --- training --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_matches_each_model_trained_alone(family, optimizer):
    """30 steps on per-model batches: the fused pack's model k ends where plain model k does."""
    models = plain_models(family, num_layers=2)
    fused = fuse(models)
    initial = [{n: t.clone() for n, t in m.state_dict().items()} for m in models]

    def make(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-2)  # element-wise: one Adam over K stacked = K Adams

    fused_opt = make(fused.parameters())
    plain_opts = [make(m.parameters()) for m in models]
    gen = torch.Generator().manual_seed(7)
    fused_losses, plain_losses = [], []
    for _ in range(30):
        x = torch.randn(K, 6, 12, 3, generator=gen)
        y = x[:, :, -2:, 0] * 0.5  # learnable: half the last two target values
        fused_opt.zero_grad(set_to_none=True)
        losses = per_model_mse(fused(x), y)
        losses.sum().backward()
        fused_opt.step()
        fused_losses.append(losses.detach())
        step_losses = []
        for k, (model, opt) in enumerate(zip(models, plain_opts)):
            opt.zero_grad(set_to_none=True)
            loss = ((model(x[k]) - y[k]) ** 2).mean()
            loss.backward()
            opt.step()
            step_losses.append(loss.detach())
        plain_losses.append(torch.stack(step_losses))
    plain_losses = torch.stack(plain_losses)
    torch.testing.assert_close(torch.stack(fused_losses), plain_losses, rtol=0, atol=ATOL)
    assert (plain_losses[-5:].mean(0) < plain_losses[:5].mean(0)).all()  # it did train
    for k, model in enumerate(models):
        trained = fused.unfuse(k).state_dict()
        for name, tensor in model.state_dict().items():
            assert not torch.allclose(tensor, initial[k][name]), name  # every tensor moved
            torch.testing.assert_close(trained[name], tensor, rtol=0, atol=ATOL, msg=name)


# --- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_matches_cudnn_and_runs_under_bf16_autocast(family):
    models = [m.cuda() for m in plain_models(family, num_layers=2, hidden_size=32)]
    fused = fuse(models)
    x, y = (t.cuda() for t in batches())
    # cuDNN's RNNs use TF32 by default; compare in full fp32
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = fused(x)
        for k, model in enumerate(models):
            torch.testing.assert_close(out[k], model(x[k]), rtol=0, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = per_model_mse(fused(x), y).sum()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in fused.parameters())
