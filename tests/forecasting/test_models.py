"""Neural forecasters: shapes, gradients, seeding, last-value normalisation, family details."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpufill.errors import InputError
from gpufill.forecasting.models import build
from gpufill.forecasting.models.neural import (
    TCNForecaster,
    TransformerForecaster,
    sinusoidal_positions,
    tcn_auto_levels,
    tcn_receptive_field,
)

FAMILIES = ["lstm", "gru", "tcn", "transformer", "mlp"]
# Small sizes keep the suite fast; the defaults are covered by the parameter-count test.
SMALL = {
    "lstm": {"hidden_size": 16, "num_layers": 2},
    "gru": {"hidden_size": 16, "num_layers": 2},
    "tcn": {"channels": 8},
    "transformer": {"d_model": 16, "nhead": 2, "num_layers": 2},
    "mlp": {"hidden_size": 16, "num_layers": 2},
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These models are tiny: one thread is as fast, and immune to other processes on the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small(family: str, n_features: int = 3, lookback: int = 12, horizon: int = 2, **params):
    return build(family, n_features=n_features, lookback=lookback, horizon=horizon, params={**SMALL[family], **params})


# --- every family ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("batch", "lookback", "n_features", "horizon"),
    [(4, 30, 3, 1), (2, 1, 1, 5), (1, 7, 1, 3), (3, 16, 4, 12)],
)
@pytest.mark.parametrize("last_value_norm", [True, False])
def test_output_shape(family, batch, lookback, n_features, horizon, last_value_norm):
    model = small(family, n_features, lookback, horizon, last_value_norm=last_value_norm)
    out = model(torch.randn(batch, lookback, n_features))
    assert out.shape == (batch, horizon)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_reach_every_parameter(family):
    torch.manual_seed(0)
    model = small(family)
    model(torch.randn(8, 12, 3)).pow(2).mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_initial_weights(family):
    def state(seed):
        torch.manual_seed(seed)
        return small(family).state_dict()

    first, again, other = state(7), state(7), state(8)
    assert list(first) == list(again)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point())


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_head_is_exactly_the_naive_forecast(family):
    torch.manual_seed(0)
    model = small(family, horizon=4).eval()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    x = torch.randn(5, 12, 3) * 10 + 3
    out = model(x)
    assert torch.equal(out, x[:, -1, 0:1].expand(5, 4))
    # without last-value normalisation the same zeroed head predicts zero
    model.last_value_norm = False
    assert torch.equal(model(x), torch.zeros(5, 4))


@pytest.mark.parametrize("family", FAMILIES)
def test_last_value_norm_makes_forecast_shift_with_the_target_level(family):
    torch.manual_seed(0)
    model = small(family).eval()
    x = torch.randn(4, 12, 3)
    shifted = x.clone()
    shifted[..., 0] += 5.0  # the target level moves; covariates do not
    with torch.no_grad():
        assert torch.allclose(model(shifted), model(x) + 5.0, atol=1e-4)
        model.last_value_norm = False
        assert not torch.allclose(model(shifted), model(x) + 5.0, atol=1e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_dropout_is_active_in_training_only(family):
    torch.manual_seed(0)
    model = small(family, dropout=0.5, num_layers=1) if family != "tcn" else small(family, dropout=0.5)
    x = torch.randn(6, 12, 3)
    assert not torch.equal(model.train()(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_default_parameter_counts():
    # (n_features=3, lookback=30, horizon=1) with every default: a guard against silent changes
    counts = {
        f: sum(p.numel() for p in build(f, n_features=3, lookback=30, horizon=1).parameters()) for f in FAMILIES
    }
    assert counts == {"lstm": 17729, "gru": 13313, "tcn": 87425, "transformer": 100417, "mlp": 28289}


# --- TCN -------------------------------------------------------------------------------------


def test_tcn_auto_levels_cover_the_lookback():
    assert tcn_receptive_field(3, 4) == 61
    assert tcn_receptive_field(3, 3) == 29  # one level fewer does not cover 30 steps
    assert tcn_auto_levels(30, 3) == 4
    assert tcn_auto_levels(29, 3) == 3
    assert tcn_auto_levels(1, 3) == 1  # never fewer than one level
    assert tcn_auto_levels(200, 5) == 5  # 1 + 8 * 31 = 249; 4 levels give 121
    model = TCNForecaster(3, 30, 1, channels=8)
    assert model.num_levels == len(model.blocks) == 4
    assert model.receptive_field == 61
    assert [b.conv1.dilation[0] for b in model.blocks] == [1, 2, 4, 8]
    # 1x1 residual projection only where the channel count changes (3 -> 8 in the first block)
    assert [b.downsample is not None for b in model.blocks] == [True, False, False, False]
    assert TCNForecaster(8, 30, 1, channels=8).blocks[0].downsample is None
    assert TCNForecaster(3, 30, 1, channels=8, num_levels=2).receptive_field == 13


def test_tcn_is_causal():
    torch.manual_seed(0)
    model = TCNForecaster(2, 20, 1, channels=8, last_value_norm=False).eval()
    activations: list[torch.Tensor] = []
    for block in model.blocks:
        block.register_forward_hook(lambda _m, _i, out: activations.append(out))
    x = torch.randn(3, 20, 2)
    changed = x.clone()
    t = 11
    changed[:, t] += 1.0
    with torch.no_grad():
        model(x)
        before, activations[:] = list(activations), []
        model(changed)
    assert len(before) == len(activations) == model.num_levels
    for a, b in zip(before, activations, strict=True):  # (batch, channels, time)
        assert torch.equal(a[:, :, :t], b[:, :, :t])  # the past is untouched
    assert not torch.equal(before[-1][:, :, t:], activations[-1][:, :, t:])  # the change is seen from t on
    # the output for a truncated window equals the activation at its last step
    with torch.no_grad():
        truncated = model(x[:, : t + 1])
        assert torch.allclose(truncated, model.head(before[-1][:, :, t]), atol=1e-6)


# --- Transformer -----------------------------------------------------------------------------


def test_transformer_uses_scaled_dot_product_attention(monkeypatch):
    calls: list[tuple[int, ...]] = []
    original = F.scaled_dot_product_attention

    def counting(q, k, v, *args, **kwargs):
        calls.append(tuple(q.shape))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    model = TransformerForecaster(3, 10, 2, d_model=16, nhead=4, num_layers=3)
    model(torch.randn(5, 10, 3))
    assert calls == [(5, 4, 10, 4)] * 3  # one call per layer, (batch, nhead, time, head_dim)


def test_transformer_positions():
    pe = sinusoidal_positions(6, 8)
    assert pe.shape == (6, 8)
    assert torch.equal(pe[0, 0::2], torch.zeros(4)) and torch.equal(pe[0, 1::2], torch.ones(4))
    assert torch.allclose(pe[3, 0], torch.sin(torch.tensor(3.0)))
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # odd width
    model = TransformerForecaster(2, 8, 1, d_model=8, nhead=2)
    assert "positions" not in model.state_dict()  # fixed, not a weight
    assert torch.equal(model.positions, sinusoidal_positions(8, 8))
    # positions make the order of the window matter (attention alone is order-blind)
    x = torch.randn(3, 8, 2)
    swapped = x[:, [1, 0, *range(2, 8)]]
    with torch.no_grad():
        assert not torch.allclose(model(x), model(swapped))
        assert model(torch.randn(3, 20, 2)).shape == (3, 1)  # another window length: recomputed


def test_transformer_feedforward_width():
    assert TransformerForecaster(1, 4, 1, d_model=16).layers[0].ff1.out_features == 64
    assert TransformerForecaster(1, 4, 1, d_model=16, dim_feedforward=24).layers[0].ff1.out_features == 24


def test_transformer_d_model_must_divide_by_nhead():
    with pytest.raises(InputError) as info:
        TransformerForecaster(3, 10, 1, d_model=30, nhead=4)
    message = str(info.value)
    assert "d_model (30) must be divisible by nhead (4)" in message
    assert "transformer.d_model" in message and "fix:" in message


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "params", "field", "text"),
    [
        ("lstm", {"hidden_size": 0}, "lstm.hidden_size", "whole number >= 1, got 0"),
        ("gru", {"num_layers": -1}, "gru.num_layers", "got -1"),
        ("gru", {"hidden_size": 2.5}, "gru.hidden_size", "got 2.5"),
        ("lstm", {"hidden_size": True}, "lstm.hidden_size", "got True"),
        ("mlp", {"dropout": 1.0}, "mlp.dropout", "number in [0, 1), got 1.0"),
        ("lstm", {"dropout": -0.1}, "lstm.dropout", "got -0.1"),
        ("transformer", {"dropout": "0.1"}, "transformer.dropout", "got '0.1'"),
        ("tcn", {"kernel_size": 1}, "tcn.kernel_size", "whole number >= 2, got 1"),
        ("tcn", {"channels": 0}, "tcn.channels", "got 0"),
        ("tcn", {"num_levels": 0}, "tcn.num_levels", "got 0"),
        ("transformer", {"dim_feedforward": 0}, "transformer.dim_feedforward", "got 0"),
        ("transformer", {"nhead": 0}, "transformer.nhead", "got 0"),
        ("mlp", {"num_layers": 0}, "mlp.num_layers", "got 0"),
        ("gru", {"last_value_norm": "yes"}, "gru.last_value_norm", "true or false, got 'yes'"),
    ],
)
def test_bad_parameter_values(family, params, field, text):
    with pytest.raises(InputError) as info:
        build(family, n_features=3, lookback=12, horizon=1, params=params)
    message = str(info.value)
    assert message.startswith(f"{field}: ")
    assert text in message
    assert "; fix: set " in message
    assert "\n" not in message


@pytest.mark.parametrize("shape_arg", ["n_features", "lookback", "horizon"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_shapes(family, shape_arg):
    shapes = {"n_features": 3, "lookback": 12, "horizon": 1, shape_arg: 0}
    with pytest.raises(InputError, match=rf"^{family}\.{shape_arg}: .*got 0; fix: set {shape_arg} to an int >= 1"):
        build(family, **shapes)


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_input_shape(family):
    model = small(family)
    with pytest.raises(InputError, match=r"^input: .*expects input \(batch, lookback, 3\), got \(2, 12, 4\); fix:"):
        model(torch.randn(2, 12, 4))
    with pytest.raises(InputError, match=r"got \(12, 3\)"):
        model(torch.randn(12, 3))


def test_mlp_needs_its_lookback():
    with pytest.raises(InputError, match=r"^input: mlp was built for lookback 12, got a window of 10; fix: build"):
        small("mlp")(torch.randn(2, 10, 3))


# --- learning --------------------------------------------------------------------------------


def sine_task(n: int = 64, lookback: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sine target (period 12) with a cosine covariate; next-step targets."""
    rng = np.random.default_rng(seed)
    t = np.arange(400)
    phase = 2 * np.pi * t / 12 + rng.uniform(0, 2 * np.pi)
    series = np.stack([np.sin(phase) + 0.05 * rng.standard_normal(t.size), np.cos(phase)], axis=-1)
    starts = rng.choice(t.size - lookback - 1, size=n, replace=False)
    x = np.stack([series[s : s + lookback] for s in starts])
    y = np.stack([series[s + lookback, :1] for s in starts])
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_learns_a_sine_wave(family):
    torch.manual_seed(0)
    x, y = sine_task()
    model = build(family, n_features=2, lookback=24, horizon=1, params=SMALL[family])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.no_grad():
        start = F.mse_loss(model(x), y).item()
    for _ in range(150):
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        end = F.mse_loss(model(x), y).item()
    assert end <= 0.5 * start, (start, end)
