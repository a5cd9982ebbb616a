"""Fused TCN / Transformer / MLP packs: model k of a pack is plain model k, in values,
gradients and training, and the pack unfuses back into plain models."""

from __future__ import annotations

import pytest
import torch

from gpufill.errors import InputError
from gpufill.forecasting.models import build
from gpufill.engine.packs.fused import fuse
from gpufill.forecasting.models.fused_feedforward import FusedMLP, FusedTCN, FusedTransformer
from gpufill.forecasting.models.neural import MLPForecaster, TCNForecaster, TransformerForecaster

K, N_FEATURES, LOOKBACK, HORIZON, BATCH = 3, 3, 12, 2, 5
ATOL = 1e-5

CONFIGS = {
    # channels != n_features: block 0 has a 1x1 downsample; levels from the lookback (2)
    "tcn-downsample": ("tcn", {"channels": 8}),
    # channels == n_features: identity residuals only; explicit levels
    "tcn-identity": ("tcn", {"channels": 3, "num_levels": 2, "last_value_norm": False}),
    "tcn-kernel2": ("tcn", {"channels": 6, "kernel_size": 2, "num_levels": 3}),
    "transformer-1": ("transformer", {"d_model": 8, "nhead": 2, "num_layers": 1}),
    "transformer-2": (
        "transformer",
        {"d_model": 12, "nhead": 3, "num_layers": 2, "dim_feedforward": 16, "last_value_norm": False},
    ),
    "mlp-1": ("mlp", {"hidden_size": 16, "num_layers": 1}),
    "mlp-3": ("mlp", {"hidden_size": 16, "num_layers": 3, "last_value_norm": False}),
}
FUSED_CLASS = {"tcn": FusedTCN, "transformer": FusedTransformer, "mlp": FusedMLP}
PLAIN_CLASS = {"tcn": TCNForecaster, "transformer": TransformerForecaster, "mlp": MLPForecaster}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread is as fast, and immune to other processes on the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plain_models(config: str, lookback: int = LOOKBACK, **extra) -> list[torch.nn.Module]:
    family, params = CONFIGS[config]
    models = []
    for seed in range(K):
        torch.manual_seed(100 + seed)  # a different init per model
        models.append(
            build(family, n_features=N_FEATURES, lookback=lookback, horizon=HORIZON, params={**params, **extra})
        )
    return models


def batches(seed: int, lookback: int = LOOKBACK, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch per model: x (K, batch, lookback, features), y (K, batch, horizon).

    The targets are a learnable function of the window (mean of the last three target
    values plus half the last covariate), so a few steps of training lower the loss.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(K, batch, lookback, N_FEATURES, generator=g)
    x[..., 0] += torch.arange(K).view(K, 1, 1) * 2.0  # models see differently placed series
    y = x[:, :, -3:, 0].mean(-1) + 0.5 * x[:, :, -1, 1]
    return x, y.unsqueeze(-1).expand(K, batch, HORIZON) + 0.1 * torch.randn(K, batch, HORIZON, generator=g)


def fused_loss(pack, x, y):
    # sum over models of each model's mean loss: model k's gradient is its plain gradient
    return ((pack(x) - y) ** 2).mean(dim=(1, 2)).sum()


def plain_loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def assert_close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# --- structure -------------------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_the_pack_has_the_plain_names_with_a_leading_model_dimension(config):
    models = plain_models(config)
    pack = fuse(models)
    family = CONFIGS[config][0]
    assert type(pack) is FUSED_CLASS[family]
    plain_state = models[0].state_dict()
    assert list(pack.state_dict()) == list(plain_state)
    for name, tensor in pack.state_dict().items():
        assert tensor.shape == (K, *plain_state[name].shape), name
        for k in range(K):
            assert torch.equal(tensor[k], models[k].state_dict()[name]), (name, k)
    assert {n for n, _ in pack.named_parameters()} == set(plain_state)


def test_the_tcn_configs_cover_blocks_with_and_without_downsample():
    with_downsample = fuse(plain_models("tcn-downsample")).state_dict()
    assert "blocks.0.downsample.weight" in with_downsample
    assert "blocks.1.downsample.weight" not in with_downsample
    assert len(plain_models("tcn-downsample")[0].blocks) == 2  # auto levels: receptive field 13 >= 12
    identity = fuse(plain_models("tcn-identity")).state_dict()
    assert not any("downsample" in name for name in identity)
    assert len(plain_models("tcn-identity")[0].blocks) == 2


# --- values and gradients --------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_model_k_of_the_pack_outputs_what_plain_model_k_outputs(config):
    models = plain_models(config)
    pack = fuse(models)
    x, _ = batches(0)
    out = pack(x)
    assert out.shape == (K, BATCH, HORIZON)
    for k, model in enumerate(models):
        assert_close(out[k], model(x[k]))
    # and the models really differ: a pack of clones would pass the check above trivially
    assert (out[0] - out[1]).abs().max() > 1e-3


@pytest.mark.parametrize("config", CONFIGS)
def test_gradients_are_per_model_and_independent(config):
    models = plain_models(config)
    pack = fuse(models)
    x, y = batches(1)
    fused_loss(pack, x, y).backward()
    grads = {name: p.grad.clone() for name, p in pack.named_parameters()}
    for k, model in enumerate(models):
        plain_loss(model, x[k], y[k]).backward()
        for name, p in model.named_parameters():
            assert_close(grads[name][k], p.grad)

    # new data for model 1 only: models 0 and 2 keep their gradients, model 1's change
    x2 = x.clone()
    x2[1] = torch.randn_like(x2[1])
    pack.zero_grad(set_to_none=True)
    fused_loss(pack, x2, y).backward()
    changed = 0.0
    for name, p in pack.named_parameters():
        assert_close(p.grad[0], grads[name][0], atol=1e-7)
        assert_close(p.grad[2], grads[name][2], atol=1e-7)
        changed = max(changed, (p.grad[1] - grads[name][1]).abs().max().item())
    assert changed > 1e-4


@pytest.mark.parametrize("config", CONFIGS)
def test_thirty_adam_steps_of_the_pack_train_each_model_as_if_alone(config):
    models = plain_models(config)
    pack = fuse(models)
    # Adam is elementwise: one Adam over the stacked parameters is K independent Adams
    pack_opt = torch.optim.Adam(pack.parameters(), lr=3e-3)
    plain_opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in models]
    held_x, held_y = batches(999, batch=64)
    with torch.no_grad():
        before = fused_loss(pack, held_x, held_y).item()
    for step in range(30):
        x, y = batches(1000 + step)
        pack_opt.zero_grad(set_to_none=True)
        fused_loss(pack, x, y).backward()
        pack_opt.step()
        for k, (model, opt) in enumerate(zip(models, plain_opts)):
            opt.zero_grad(set_to_none=True)
            plain_loss(model, x[k], y[k]).backward()
            opt.step()
    with torch.no_grad():
        assert fused_loss(pack, held_x, held_y).item() < 0.8 * before  # it trained
        for k, model in enumerate(models):
            trained = pack.unfuse(k)
            for name, tensor in without_key_bias(model).items():
                assert_close(without_key_bias(trained)[name], tensor)
            assert_close(trained(held_x[k]), model(held_x[k]))


def without_key_bias(model) -> dict[str, torch.Tensor]:
    """The state dict with the attention key biases zeroed.

    Adding a bias to every key adds the same q.b to all of a query's scores, which the
    softmax ignores: its gradient is zero up to rounding (~1e-9), and Adam divides that
    noise by its own size, so the key bias walks by ~lr per step in the plain and the
    fused model alike, differently, and without effect on any output.
    """
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    if isinstance(model, TransformerForecaster):
        d = model.d_model
        for i in range(model.num_layers):
            state[f"layers.{i}.qkv.bias"][d : 2 * d] = 0.0
    return state


def test_the_key_bias_gets_no_gradient_but_rounding():
    model = plain_models("transformer-2")[0]
    x, y = batches(7)
    plain_loss(model, x[0], y[0]).backward()
    d = model.d_model
    for layer in model.layers:
        grad = layer.qkv.bias.grad
        assert grad[d : 2 * d].abs().max() < 1e-6
        assert grad[:d].abs().max() > 1e-4 and grad[2 * d :].abs().max() > 1e-4  # query and value biases learn


# --- unfuse, dropout, other windows ----------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_unfuse_gives_back_each_plain_model_exactly(config):
    models = plain_models(config)
    pack = fuse(models)
    x, _ = batches(2)
    for k, model in enumerate(models):
        plain = pack.unfuse(k)
        assert type(plain) is PLAIN_CLASS[CONFIGS[config][0]]
        state = plain.state_dict()
        assert list(state) == list(model.state_dict())
        for name, tensor in model.state_dict().items():
            assert torch.equal(state[name], tensor), name
        assert torch.equal(plain(x[k]), model(x[k]))
        # a copy, not a view into the pack
        assert all(p.data_ptr() != q.data_ptr() for p in plain.parameters() for q in pack.parameters())


@pytest.mark.parametrize("config", ["tcn-downsample", "transformer-2", "mlp-3"])
def test_dropout_acts_in_training_only(config):
    models = plain_models(config, dropout=0.3)
    pack = fuse(models)
    x, _ = batches(3)
    pack.eval()
    for model in models:
        model.eval()
    evaluated = pack(x)
    for k, model in enumerate(models):
        assert_close(evaluated[k], model(x[k]))
    pack.train()
    first, second = pack(x), pack(x)
    assert (first - evaluated).abs().max() > 1e-3
    assert (first - second).abs().max() > 1e-3


@pytest.mark.parametrize("config", ["tcn-downsample", "tcn-kernel2", "transformer-1", "transformer-2"])
def test_windows_of_another_length_match_the_plain_models(config):
    # TCN is length-agnostic; the transformer recomputes its positions for the window
    models = plain_models(config)
    pack = fuse(models)
    x, _ = batches(4, lookback=7)
    out = pack(x)
    for k, model in enumerate(models):
        assert_close(out[k], model(x[k]))


def test_the_fused_mlp_refuses_a_window_of_another_length():
    pack = fuse(plain_models("mlp-1"))
    with pytest.raises(InputError, match="lookback 12, got a window of 7"):
        pack(batches(5, lookback=7)[0])


def test_a_pack_refuses_input_without_the_model_dimension():
    pack = fuse(plain_models("tcn-downsample"))
    with pytest.raises(InputError, match="expects input"):
        pack(torch.randn(BATCH, LOOKBACK, N_FEATURES))


# --- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["tcn-downsample", "transformer-2", "mlp-3"])
def test_the_pack_matches_the_plain_models_on_cuda(config):
    models = [m.cuda() for m in plain_models(config)]
    pack = fuse(models)
    assert next(pack.parameters()).is_cuda
    x, y = (t.cuda() for t in batches(6))
    # TF32 would make kernel choice, not fusion, decide the error: compare in full fp32
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        out = pack(x)
        fused_loss(pack, x, y).backward()
        for k, model in enumerate(models):
            assert_close(out[k], model(x[k]), atol=1e-4)
            plain_loss(model, x[k], y[k]).backward()
            for name, p in model.named_parameters():
                assert_close(dict(pack.named_parameters())[name].grad[k], p.grad, atol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
