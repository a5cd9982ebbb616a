"""Batches of any structure train through `fit` with the automatic plan, checked by value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from gpufill.engine.loop import fit
from tests.engine.common import assert_learned, assert_same_weights, classification, linear, mlp, regression


def dict_mse(model, batch):
    return F.mse_loss(model(batch["x"]), batch["y"])


def test_dict_batches_with_a_callable_loss_learn():
    """A dict of tensors is resident, batched leaf by leaf, and reaches the loss as a dict."""
    x, y = regression()
    seen = []

    def loss(model, batch):
        seen.append(sorted(batch))
        return dict_mse(model, batch)

    result = fit(linear(), {"x": x, "y": y}, epochs=6, lr=0.3, loss=loss)
    assert result.plan.data_placement.value == "device"
    assert seen and all(keys == ["x", "y"] for keys in seen)
    assert_learned(result, 0.1)


def test_three_tuples_with_a_weighted_loss_follow_the_weights():
    """(x, y, weight): samples of weight 0 do not count, so the model fits the weighted ones only."""
    x, y = regression(n=160)
    weight = (torch.arange(160) % 2).float()  # odd rows count, even rows are noise the loss ignores
    y_noisy = torch.where(weight.bool().unsqueeze(1), y, torch.full_like(y, 50.0))

    def weighted(model, batch):
        inputs, targets, w = batch
        per_sample = (model(inputs) - targets).pow(2).squeeze(1)
        return (w * per_sample).sum() / w.sum().clamp(min=1)

    result = fit(linear(), (x, y_noisy, weight), epochs=12, lr=0.3, loss=weighted)
    assert_learned(result, 0.1)
    with torch.no_grad():
        fitted = F.mse_loss(result.model(x[1::2]), y[1::2]).item()
    assert fitted < 0.05  # the weight-1 rows are fitted; the weight-0 rows' 50s did not pull it away


class TwoInputs(nn.Module):
    """A numeric part and a categorical id per sample: inputs arrive as the tuple (x_num, x_cat)."""

    def __init__(self, categories: int = 5):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(categories, 2)
        self.head = nn.Linear(4 + 2, 1)

    def forward(self, inputs):
        x_num, x_cat = inputs
        return self.head(torch.cat([x_num, self.embed(x_cat)], dim=1))


def test_nested_inputs_with_a_named_loss():
    """((x_num, x_cat), y) with loss="mse": the model gets the inner tuple, the loss the targets."""
    x, y = regression(n=160)
    x_cat = torch.arange(160) % 5
    offsets = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    y = y + offsets[x_cat].unsqueeze(1)
    result = fit(TwoInputs(), ((x, x_cat), y), epochs=15, lr=0.3, loss="mse")
    assert_learned(result, 0.1)
    assert result.metrics["train_loss"] < 0.1


def test_numpy_arrays_train_and_are_cast_to_the_model_dtype():
    """float64 numpy arrays become float32 tensors (noted in the events), and the model learns."""
    x, y = regression()
    result = fit(linear(), (x.double().numpy(), y.double().numpy()), epochs=6, lr=0.3)
    assert "train: float64 tensors cast to float32 (the model's weights' dtype)" in result.events
    assert result.model.weight.dtype == torch.float32
    assert_learned(result, 0.1)


def test_a_users_dataloader_trains_with_its_own_batch():
    """A DataLoader is used as given: its batch is the effective batch, no accumulation, lr unchanged."""
    x, y = regression()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    result = fit(linear(), loader, epochs=6, lr=0.3)
    assert result.plan.data_placement.value == "loader"
    assert (result.plan.effective_batch.value, result.plan.micro_batch.value, result.plan.accumulation.value) == (16, 16, 1)
    assert result.plan.lr_scale.value == 1.0
    assert_learned(result, 0.1)


def test_batch_size_twice_the_loaders_accumulates_two_loader_batches():
    """batch_size = 2 x the loader's batch: two loader batches per optimizer step (the last step of
    100 samples is one short batch of 4), exactly the training on a loader of twice the batch with
    micro_batch = the small batch."""
    x, y = regression(n=100)
    data = TensorDataset(x, y)
    steps = []

    class Steps:
        def log_iteration(self, seconds, *, samples=0, data_wait_s=0.0):
            steps.append(samples)

    small = fit(linear(), DataLoader(data, batch_size=16), epochs=5, lr=0.05, batch_size=32, monitor=Steps())
    assert (small.plan.effective_batch.value, small.plan.micro_batch.value, small.plan.accumulation.value) == (32, 16, 2)
    assert steps == [32, 32, 32, 4] * 5  # 7 loader batches -> 4 optimizer steps per epoch
    big = fit(linear(), DataLoader(data, batch_size=32), epochs=5, lr=0.05, micro_batch=16)
    assert (big.plan.effective_batch.value, big.plan.micro_batch.value, big.plan.accumulation.value) == (32, 16, 2)
    assert_same_weights(small.model, big.model, atol=1e-6)
    for a, b in zip(small.history, big.history, strict=True):
        assert abs(a.train_loss - b.train_loss) < 1e-6
    assert_learned(small, 0.3)


class Stream(IterableDataset):
    """n regression samples, one at a time; counts the samples it yields."""

    def __init__(self, n: int = 96):
        self.x, self.y = regression(n)
        self.yielded = 0

    def __iter__(self):
        for i in range(len(self.x)):
            self.yielded += 1
            yield self.x[i], self.y[i]


class CountSteps:
    """A monitor that records each optimizer step's sample count."""

    def __init__(self):
        self.samples: list[int] = []

    def log_iteration(self, seconds, *, samples=0, data_wait_s=0.0):
        self.samples.append(samples)


def test_an_iterable_dataset_epoch_is_one_pass():
    """Without steps_per_epoch an epoch is one pass of the stream (96 samples: 6 steps of 16)."""
    monitor = CountSteps()
    result = fit(linear(), Stream(96), epochs=6, lr=0.3, batch_size=16, monitor=monitor)
    assert result.plan.data_placement.value == "loader"
    assert monitor.samples == [16] * 36
    assert "an epoch is 96 samples (counted in the first epoch)" in result.events
    assert_learned(result, 0.1)


def test_an_iterable_dataset_with_steps_per_epoch_continues_across_epochs():
    """steps_per_epoch=4 of 16 samples: epochs take 64 samples each from one stream that restarts when it runs out."""
    stream = Stream(96)
    monitor = CountSteps()
    result = fit(linear(), stream, epochs=6, lr=0.3, batch_size=16, steps_per_epoch=4, monitor=monitor)
    assert len(result.history) == 6 and monitor.samples == [16] * 24
    # 24 steps x 16 = 384 samples = 4 passes of 96, plus the 2 samples fit reads first to classify the data.
    assert stream.yielded == 384 + 2
    assert not any(e.startswith("an epoch is") for e in result.events)
    assert_learned(result, 0.1)


class DictDataset(Dataset):
    """A map-style Dataset whose samples are dicts (collated into dicts of batches)."""

    def __init__(self, x, labels):
        self.x, self.labels = x, labels

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.labels[i]}


def dict_cross_entropy(model, batch):
    return F.cross_entropy(model(batch["features"]), batch["label"])


def test_a_datasets_shuffle_follows_the_seed():
    """Read through a DataLoader, a Dataset's order comes from fit's generator: the same seed gives the same
    weights, another seed another order (a different first-epoch loss from the same initial weights)."""
    dataset = DictDataset(*classification(n=96))
    runs = [fit(mlp(outputs=3, seed=0), dataset, epochs=2, lr=0.03, batch_size=16, loss=dict_cross_entropy, seed=seed) for seed in (1, 1, 2)]
    assert runs[0].plan.data_placement.value == "loader"
    assert_same_weights(runs[0].model, runs[1].model, atol=0)
    assert runs[0].history[0].train_loss != pytest.approx(runs[2].history[0].train_loss, abs=1e-7)


def test_a_map_style_dataset_of_dicts_reaches_an_accuracy():
    """A Dataset returning dicts goes through a DataLoader built from the plan; the classifier learns."""
    x, labels = classification(n=192)

    def loss(model, batch):
        scores = model(batch["features"])
        return {"loss": F.cross_entropy(scores, batch["label"]), "accuracy": (scores.argmax(1) == batch["label"]).float().mean()}

    val = DictDataset(*classification(n=64, seed=1))
    result = fit(mlp(outputs=3), DictDataset(x, labels), val, epochs=15, lr=0.03, batch_size=16, loss=loss)
    assert result.plan.data_placement.value == "loader" and result.plan.loader.value.num_workers == 0
    assert_learned(result, 0.5)
    assert result.metrics["train_accuracy"] > 0.9 and result.metrics["val_accuracy"] > 0.85
    # val_<name> is the best epoch's
    best = next(r for r in result.history if r.epoch == result.metrics["best_epoch"])
    assert result.metrics["val_accuracy"] == best.val_metrics["accuracy"]
