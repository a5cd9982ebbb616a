"""Bad input to fit: one line naming the argument and the fix, raised before any training (the issue's list)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gpufill.engine.loop import fit
from tests.engine.common import input_error, linear, regression


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"grad_clip": 0.0}, "grad_clip", ()),
    ({"grad_clip": -1.0}, "grad_clip", ()),
    ({"weight_decay": -0.1}, "weight_decay", ()),
    ({"min_delta": -1e-3}, "min_delta", ()),
    ({"precision": "banana"}, "precision", ("banana", "bf16")),
    ({"epochs": 2.5}, "epochs", ("2.5", "whole number")),
    ({"epochs": 0}, "epochs", ("whole number",)),
    ({"batch_size": 0}, "batch_size", ()),
    ({"micro_batch": 0}, "micro_batch", ()),
    ({"lr": -1.0}, "lr", ()),
    ({"optimizer": "lamb"}, "optimizer", ("adamw",)),
    ({"schedule": "cosine"}, "schedule", ("warmup_cosine",)),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio", ()),
    ({"warmup_steps": -3}, "warmup_steps", ()),
    ({"steps_per_epoch": 0}, "steps_per_epoch", ()),
    ({"device": "tpu"}, "device", ()),
    ({"device": 0}, "device", ("int",)),
    ({"patience": -1}, "patience", ()),
    ({"loss": "cosine"}, "loss", ("cross_entropy",)),
])
def test_bad_settings_name_the_argument(overrides, field, words):
    x, y = regression(32)
    input_error(fit, linear(), (x, y), field=field, contains=words, **overrides)


def test_an_unknown_keyword_names_the_close_match():
    x, y = regression(32)
    input_error(fit, linear(), (x, y), learning_rate=1e-3, field="fit", contains=("learning_rate",))


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x, y = regression(32)
    input_error(fit, linear(), (x, y), device="cuda", field="device", contains=("CUDA",))


def test_a_model_that_is_not_a_module():
    x, y = regression(32)
    input_error(fit, lambda t: t, (x, y), field="model", contains=("function", "nn.Module"))


def test_mismatched_leaves_name_both_lengths():
    x, y = regression(32)
    input_error(fit, linear(), {"x": x, "y": y[:30]}, loss=lambda m, b: (m(b["x"]) - b["y"]).pow(2).mean(), field="train",
                contains=("32", "30"))


def test_float64_inputs_are_cast_to_the_models_dtype_with_a_note():
    x, y = regression(64)
    result = fit(linear(), (x.double(), y.double()), epochs=2, batch_size=16)
    assert any("float64" in event and "float32" in event for event in result.events), result.events
    assert result.history[-1].train_loss < result.history[0].train_loss


def test_numpy_float64_inputs_train_too():
    x, y = regression(64)
    result = fit(linear(), (x.numpy().astype(np.float64), y.numpy().astype(np.float64)), epochs=2, batch_size=16)
    assert result.history[-1].train_loss < result.history[0].train_loss


def test_integer_inputs_to_a_float_model_are_one_line():
    x, y = regression(32)
    input_error(fit, linear(), (x.long(), y), epochs=1, field="train", contains=("Long", "x.float()", "nn.Embedding"))


def test_empty_data_is_refused():
    x, y = regression(32)
    input_error(fit, linear(), (x[:0], y[:0]), field="train", contains=("no samples",))
    input_error(fit, linear(), TensorDataset(x[:0], y[:0]), field="train", contains=("no samples",))
    input_error(fit, linear(), DataLoader(TensorDataset(x[:0], y[:0]), batch_size=4), field="train", contains=("no",))


def test_a_dataset_whose_items_differ_in_structure_is_one_line():
    x, y = regression(32)

    class Ragged(Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return (x[i], y[i]) if i % 2 == 0 else (x[i], y[i], y[i])

    input_error(fit, linear(), Ragged(), epochs=1, batch_size=8, field="train",
                contains=("item 0 is a tuple of 2, item 1 is a tuple of 3",))
