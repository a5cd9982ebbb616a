"""Operators per pack step, counted under a dispatch mode (about one kernel launch each on a GPU):
the figures issue 14 set against the per-parameter optimizer and the autograd-unrolled recurrence."""

from __future__ import annotations

import pytest
import torch

from gpufill.engine.measure.ops import count_ops
from gpufill.engine.packs.size import measure_pack_size
from gpufill.engine.packs.fused import fuse
from gpufill.engine.packs.optim import PackAdamW
from gpufill.forecasting.models import registry

BEFORE_LSTM_STEP = 958  # issue 14's count for the LSTM pack (hidden 128, lookback 30) before this change
BEFORE_LSTM_OPTIMIZER = 129  # the per-parameter PackAdamW's operators for the same pack


def test_views_count_nothing_and_each_computing_operator_once():
    x = torch.randn(4, 5, requires_grad=True)
    assert count_ops(lambda: (x.t(), x[0], x.view(20), x.unsqueeze(0))).total == 0
    count = count_ops(lambda: (x * 2 + 1).sum())
    assert count.total == 3 and dict(count.by_name) == {"mul": 1, "add": 1, "sum": 1}
    y = (x * x).sum()
    assert count_ops(y.backward).total >= 2  # the mul's backward: two products (and autograd's seed)


def _pack_step(family: str, params: dict, k: int = 2, batch: int = 8, lookback: int = 30):
    torch.manual_seed(0)
    fused = fuse([registry.build(family, n_features=3, lookback=lookback, horizon=1, params=params) for _ in range(k)])
    optimizer = PackAdamW(list(fused.parameters()), torch.full((k,), 1e-3), torch.zeros(k))
    x, y = torch.randn(k, batch, lookback, 3), torch.randn(k, batch, 1)
    active = torch.ones(k, dtype=torch.bool)

    def forward_backward() -> None:
        (fused(x) - y).pow(2).mean(dim=(1, 2)).sum().backward()

    forward_backward()
    return forward_backward, lambda: optimizer.step(active), optimizer


def test_the_lstm_pack_step_is_at_least_2x_and_pack_adamw_at_least_5x_fewer_operators():
    forward_backward, optimizer_step, _ = _pack_step("lstm", {"hidden_size": 128})
    optimizer_ops = count_ops(optimizer_step).total
    step_ops = count_ops(forward_backward).total + optimizer_ops
    assert step_ops <= BEFORE_LSTM_STEP / 2, step_ops
    assert optimizer_ops <= BEFORE_LSTM_OPTIMIZER / 5, optimizer_ops


@pytest.mark.parametrize(("family", "params"), [("transformer", {"d_model": 64, "nhead": 4, "num_layers": 2}), ("tcn", {"channels": 64}),
                                                ("gru", {"hidden_size": 64}), ("mlp", {"hidden_size": 64})])
def test_pack_adamw_costs_the_same_operators_however_many_parameters_a_model_has(family, params):
    _, optimizer_step, optimizer = _pack_step(family, params)
    assert len(optimizer.params) >= 4
    assert count_ops(optimizer_step).total <= 25


def test_the_recurrence_costs_a_fixed_number_of_operators_per_time_step():
    """Per extra time step: LSTM 7 forward + 5 backward, GRU 5 + 6 (the hand-written backward)."""
    for family, per_step in (("lstm", 12), ("gru", 11)):
        counts = []
        for lookback in (20, 30):
            forward_backward, _, _ = _pack_step(family, {"hidden_size": 16}, lookback=lookback)
            counts.append(count_ops(forward_backward).total)
        assert (counts[1] - counts[0]) / 10 == pytest.approx(per_step, abs=0.5), (family, counts)


def test_measuring_pack_sizes_can_count_each_candidates_operators():
    def build() -> torch.nn.Module:
        return registry.build("lstm", n_features=3, lookback=12, horizon=1, params={"hidden_size": 8})

    choice = measure_pack_size(build, (torch.randn(32, 12, 3), torch.randn(32, 1)), batch=16, device="cpu", candidates=(1, 2, 4), steps=1, count=True, min_gain=None)
    assert set(choice.ops_per_step) == {1, 2, 4}
    assert choice.ops_per_step[2] == choice.ops_per_step[4]  # a pack's launches do not grow with K
