"""A user's nn.GRU or nn.LSTM in a pack (issue 35): vmap gets a batching rule through `stacked_rnn.VmappedGRU` /
`VmappedLSTM`, so K models' recurrent layers step as one hand-written recurrence and end where each ends alone."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state

import gpufill
from gpufill.engine.packs.stacked import StackedModule, why_not_stacked
from gpufill.engine.packs.stacked_rnn import VmappedGRU, VmappedLSTM, batched_recurrences

TWINS = {"gru": (nn.GRU, VmappedGRU), "lstm": (nn.LSTM, VmappedLSTM)}

EXACT = {"probe": False, "precision": "fp32", "threads": 1, "device": "cpu"}


class SequenceNet(nn.Module):
    """A GRU or LSTM read at its last step and its final state (an LSTM's h_n and c_n: every output used), as users
    write it."""

    def __init__(self, layers: int = 1, batch_first: bool = True, bidirectional: bool = False, with_state: bool = False, cell: str = "gru"):
        super().__init__()
        self.rnn = TWINS[cell][0](3, 12, num_layers=layers, batch_first=batch_first, bidirectional=bidirectional)
        self.head = nn.Linear(12 * (2 if bidirectional else 1), 1)
        self.batch_first, self.with_state, self.cell = batch_first, with_state, cell

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_state:
            zeros = torch.zeros(self.rnn.num_layers, x.shape[0 if self.batch_first else 1], 12)
            out, state = self.rnn(x, zeros if self.cell == "gru" else (zeros, zeros))
        else:
            out, state = self.rnn(x)
        last = out[:, -1] if self.batch_first else out[-1]
        final = state[-1] if self.cell == "gru" else state[0][-1] - 0.5 * state[1][-1]
        return self.head(last) + 0.1 * final.sum(dim=-1, keepdim=True)


def _lstm_net(**kwargs) -> SequenceNet:
    return SequenceNet(cell="lstm", **kwargs)


def _sequences(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, 3, generator=g)
    return x, x[:, -3:, 0].sum(dim=1, keepdim=True)


@pytest.mark.parametrize("cell", list(TWINS))
@pytest.mark.parametrize(("layers", "batch_first"), [(1, True), (2, False)])
def test_k_recurrent_layers_under_vmap_give_each_models_own_loss_and_gradients(layers, batch_first, cell):
    torch.manual_seed(0)
    models = [SequenceNet(layers, batch_first, cell=cell) for _ in range(4)]
    x = torch.randn(4, 8, 10, 3) if batch_first else torch.randn(4, 10, 8, 3)
    y = torch.randn(4, 8, 1)
    params, _ = stack_module_state(models)
    params = {name: value.detach().clone().requires_grad_() for name, value in params.items()}
    base = copy.deepcopy(models[0])
    assert batched_recurrences(base) == 1 and isinstance(base.rnn, TWINS[cell][1])

    def loss(state, xs, ys):
        return nn.functional.mse_loss(functional_call(base, state, (xs,)), ys)

    losses = torch.vmap(loss)(params, x, y)
    losses.sum().backward()
    for k, model in enumerate(models):
        alone = nn.functional.mse_loss(model(x[k]), y[k])
        alone.backward()
        assert float(losses[k].detach()) == pytest.approx(float(alone.detach()), rel=1e-6, abs=1e-7)
        for name, p in model.named_parameters():
            assert torch.allclose(params[name].grad[k], p.grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("cell", list(TWINS))
def test_the_swapped_layer_called_alone_computes_and_differentiates_as_torchs_own(cell):
    torch.manual_seed(1)
    plain = SequenceNet(layers=2, cell=cell)
    swapped = copy.deepcopy(plain)
    batched_recurrences(swapped)
    x, y = _sequences(16)
    for model in (plain, swapped):
        nn.functional.mse_loss(model(x), y).backward()
    assert torch.allclose(plain(x), swapped(x), atol=1e-6)
    for (name, p), q in zip(plain.named_parameters(), swapped.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


def test_what_the_batched_layers_do_not_take_stay_plain_or_are_refused_with_their_reason():
    bidirectional = SequenceNet(bidirectional=True)
    assert batched_recurrences(copy.deepcopy(bidirectional)) == 0  # left as nn.GRU: vmap decides (and cannot batch it)
    assert batched_recurrences(nn.Sequential(nn.LSTM(3, 12, proj_size=4), nn.LSTM(3, 12, bias=False))) == 0
    x, y = _sequences(8)

    def mse(model, batch):
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    reason = why_not_stacked([SequenceNet(with_state=True), SequenceNet(with_state=True)], mse, (x, y))
    assert reason is not None and "a packed nn.GRU starts from zeros: an initial state is not batched" in reason
    reason = why_not_stacked([_lstm_net(with_state=True), _lstm_net(with_state=True)], mse, (x, y))
    assert reason is not None and "a packed nn.LSTM starts from zeros: an initial state is not batched" in reason
    assert why_not_stacked([SequenceNet(), SequenceNet()], mse, (x, y)) is None
    assert why_not_stacked([_lstm_net(), _lstm_net()], mse, (x, y)) is None
    assert isinstance(StackedModule.from_models([SequenceNet(), SequenceNet()]).base.rnn, VmappedGRU)
    assert isinstance(StackedModule.from_models([_lstm_net(), _lstm_net()]).base.rnn, VmappedLSTM)


@pytest.mark.parametrize("make", [SequenceNet, _lstm_net], ids=["gru", "lstm"])
def test_a_pack_of_recurrent_nets_with_their_own_lrs_ends_where_each_ends_alone(make):
    x, y = _sequences(96)
    train, val = (x[:80], y[:80]), (x[80:], y[80:])
    variants = [{"seed": s, "lr": lr, "weight_decay": wd} for s, lr, wd in zip(range(4), [1e-3, 3e-3, 1e-2, 5e-3], [0.0, 0.01, 0.0, 0.1], strict=True)]
    settings = {**EXACT, "loss": "mse", "batch_size": 16, "epochs": 3, "optimizer": "adam"}
    packed = gpufill.fit_many(make, train, val, variants=variants, pack=True, **settings)
    assert [r.plan.pack_size.value for r in packed] == [4] * 4
    for variant, result in zip(variants, packed, strict=True):
        torch.manual_seed(variant["seed"])
        alone = gpufill.fit(make(), train, val, **{**settings, **variant})
        assert type(result.model.rnn) is type(alone.model.rnn)  # the user gets their own module back
        for (name, p), q in zip(result.model.named_parameters(), alone.model.parameters(), strict=True):
            assert float((p - q).detach().abs().max()) < 1e-5, (variant, name)
        assert result.metrics["val_loss"] == pytest.approx(alone.metrics["val_loss"], rel=1e-5)
