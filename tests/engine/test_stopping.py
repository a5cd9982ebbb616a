"""One suite for the stop rules of every training (engine/epochs.py), run for K = 1 (`fit`)
and K > 1 (a campaign's fused pack, `fit_many`'s variants): each rule must end a row where its own words say, the
same way whichever loop drives it — as Optuna's testing/pytest_samplers.py runs one suite over every sampler."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from gpufill.engine.config import FitConfig
from gpufill.engine.loop import fit
from gpufill.engine.packs.many import fit_many
from gpufill.engine.packs.train import PackMember, fit_pack
from gpufill.engine.result import FitResult
from gpufill.engine.epochs import BestWeights, Rules, Stopping

Data = tuple[torch.Tensor, torch.Tensor]


def _data(seed: int, n: int = 256, *, corrupt: bool = False) -> tuple[Data, Data]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, 1, generator=generator)
    y = x[:, -3:, 0].sum(dim=1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=generator)
    if corrupt:
        y = y.clone()
        y[5] = float("nan")
    return (x[:192], y[:192]), (x[192:], y[192:])


def _model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1))


def _fit(config: FitConfig, datasets: list[tuple[Data, Data]]) -> list[FitResult]:
    out = []
    for i, (train, val) in enumerate(datasets):
        torch.manual_seed(i)
        out.append(fit(_model(), train, val, config=dataclasses.replace(config, seed=i)))
    return out


def _pack(config: FitConfig, datasets: list[tuple[Data, Data]]) -> list[FitResult]:
    models = []
    for i in range(len(datasets)):
        torch.manual_seed(i)
        models.append(_model())
    members = [PackMember(train=train, val=val, lr=config.lr, weight_decay=0.0, seed=i) for i, (train, val) in enumerate(datasets)]
    return fit_pack(models, members, config=config)


def _many(config: FitConfig, datasets: list[tuple[Data, Data]]) -> list[FitResult]:
    train, val = datasets[0]  # variants share their data (_datasets)
    return fit_many(_model, train, val, variants=[{"seed": i} for i in range(len(datasets))], config=config, pack=True)


TRAINERS: dict[str, Callable[[FitConfig, list[tuple[Data, Data]]], list[FitResult]]] = {"fit (K = 1)": _fit, "fused pack": _pack,
                                                                                         "fit_many pack": _many}
SETTINGS = dict(epochs=6, batch_size=32, lr=3e-3, loss="mse", precision="fp32", compile=False, threads=1, verbose=False)


def _datasets(trainer: str, k: int = 2, **options: bool) -> list[tuple[Data, Data]]:
    if trainer == "fit_many pack":  # the variants share their data
        shared = _data(0, **options)
        return [shared] * k
    return [_data(i, **options) for i in range(k)]


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_max_steps_ends_each_row_at_its_steps_with_the_event(trainer):
    config = FitConfig(**SETTINGS, patience=None, max_steps=9, restore_best=False)
    for result in TRAINERS[trainer](config, _datasets(trainer)):
        assert sum(record.steps for record in result.history) == 9 and len(result.history) == 2  # 6 steps an epoch
        assert result.status == "completed" and "stopped at max_steps 9 in epoch 2 (3 of its steps)" in result.events


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_early_stopping_ends_a_row_patience_validations_after_its_best_and_restores_it(trainer):
    config = FitConfig(**{**SETTINGS, "epochs": 30, "lr": 3e-2}, patience=2, min_delta=0.0)
    results = TRAINERS[trainer](config, _datasets(trainer))
    assert [r.status for r in results] == ["early_stopped", "early_stopped"]  # at 3e-2 the validation turns within 30 epochs
    for result in results:
        losses = [record.val_loss for record in result.history]
        best = min(range(len(losses)), key=losses.__getitem__) + 1
        assert result.metrics["best_epoch"] == best and result.metrics["val_loss"] == losses[best - 1]
        if result.status == "early_stopped":  # two validations without a better one, then it stops
            assert len(losses) == best + 2 and all(loss >= losses[best - 1] for loss in losses[best:])
            assert any(e.startswith(f"early stop at epoch {best + 2}: no improvement for 2 validations") for e in result.events)
        else:
            assert result.status == "completed" and len(losses) == 30
        assert any(e.startswith(f"restored the best weights (epoch {best},") for e in result.events)


@pytest.mark.parametrize("trainer", ["fit (K = 1)", "fused pack"])
def test_a_non_finite_loss_ends_its_row_as_diverged_and_never_restores_it(trainer):
    datasets = [_data(0, corrupt=True), _data(1)]
    results = TRAINERS[trainer](FitConfig(**SETTINGS, patience=None), datasets)
    assert results[0].status == "diverged" and len(results[0].history) == 1
    assert any(e.startswith("diverged at epoch 1: loss is") for e in results[0].events)
    assert not any(e.startswith("restored the best weights") for e in results[0].events)
    assert results[1].status == "completed" and len(results[1].history) == 6


def test_stopping_judges_rows_alone_and_best_weights_keep_rows_of_stacked_tensors():
    """The rules without a model: a row whose validation worsens stops after `patience`, another goes on; a pack
    row's event says the rest went on; BestWeights copies only the improved rows."""
    stopping = Stopping(2, Rules(epochs=10, max_steps=None, patience=2, min_delta=0.0, validate_every=1, restore_best=True), packed=True)
    for epoch, val in enumerate([[1.0, 1.0], [0.5, 1.1], [0.4, 1.2], [0.3, 1.3]], start=1):
        stopping.count(stopping.training, [4, 4])
        stopping.judge(epoch, [1.0, 1.0], val, rows=stopping.training, steps=[4, 4])
    assert stopping.status == ["completed", "early_stopped"] and stopping.best_epoch == [4, 1] and stopping.training == [0]
    assert stopping.events[1] == ["early stop at epoch 3: no improvement for 2 validations; masked, the rest of the pack went on"]
    weights = {"w": torch.zeros(3, 2)}
    best = BestWeights(lambda: weights, stacked=True)
    best.keep([0, 2])
    weights["w"].fill_(1.0)
    best.keep([1])
    weights["w"].fill_(2.0)
    best.restore([0, 1])
    assert weights["w"].tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
