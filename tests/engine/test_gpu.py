"""The engine on CUDA (run where a GPU is lent; skipped elsewhere): equivalence with TF32 off, bf16 trainings of
any structure, resumable checkpoints, a loss function under autocast, and a user's DataLoader from pinned memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpufill.engine.loop import fit
from tests.engine.common import assert_same_weights, classification
from tests.engine.test_batch_structures import DictDataset, dict_cross_entropy
from tests.engine.equivalence import SETTINGS, data, dict_loss, hand_loop, make_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fp32_fit_on_cuda_equals_the_hand_loop_with_tf32_off(optimizer):
    """The same batches (fit draws its order from a CUDA generator on CUDA; so does the hand loop here)."""
    result = fit(make_model(), data(), loss=dict_loss, optimizer=optimizer, device="cuda", tf32=False, compile=False, **SETTINGS)
    reference = make_model().cuda()
    means = hand_loop(reference, {name: value.cuda() for name, value in data().items()}, optimizer=optimizer, device="cuda", **SETTINGS)
    assert_same_weights(result.model, reference, atol=1e-5)
    assert [r.train_loss for r in result.history] == pytest.approx(means, abs=1e-5)
    assert means[-1] < means[0]


def test_a_per_sample_dataset_on_cuda_shuffles_from_the_seed():
    """A Dataset is read through a DataLoader, which shuffles on the host: its order follows fit's (CUDA) generator."""
    x, labels = classification(n=1024)
    dataset = DictDataset(x, labels)
    runs = [fit(make_classifier(), dataset, loss=dict_cross_entropy, epochs=3, lr=0.01, device="cuda", batch_size=64, seed=seed)
            for seed in (1, 1, 2)]
    assert runs[0].plan.data_placement.value == "loader"
    assert_same_weights(runs[0].model, runs[1].model, atol=1e-6)
    assert runs[0].history[-1].train_loss < 0.6 * runs[0].history[0].train_loss
    assert runs[0].history[0].train_loss != runs[2].history[0].train_loss  # another seed, another order


def test_bf16_classifier_with_a_loss_function_learns_and_reports_its_metric():
    x, labels = classification(n=2048)
    result = fit(make_classifier(), {"x": x, "y": labels}, {"x": x[:256], "y": labels[:256]}, precision="bf16", epochs=5, lr=0.01,
                 loss=lambda model, batch: {"loss": torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"]),
                                            "accuracy": (model(batch["x"]).argmax(1) == batch["y"]).float().mean()},
                 device="cuda", batch_size=128)
    assert result.plan.precision.value == "bf16"
    assert result.metrics["val_accuracy"] > 0.85


def test_a_users_pinned_dataloader_on_cuda_trains():
    x, labels = classification(n=1024)
    loader = DataLoader(TensorDataset(x, labels), batch_size=64, shuffle=True, pin_memory=True)
    result = fit(make_classifier(), loader, loss="cross_entropy", epochs=3, lr=0.01, device="cuda")
    assert result.history[-1].train_loss < 0.6 * result.history[0].train_loss


def test_a_cuda_checkpoint_resumes_to_the_same_weights(tmp_path):
    settings = dict(loss=dict_loss, epochs=4, batch_size=16, lr=0.01, seed=2, device="cuda", precision="bf16", checkpoint_every=1)
    straight = fit(make_model(), data(), **settings)
    fit(make_model(), data(), checkpoint_dir=tmp_path, **{**settings, "epochs": 2})
    resumed = fit(make_model(seed=9), data(), checkpoint_dir=tmp_path, resume=True, **settings)
    assert_same_weights(straight.model, resumed.model, atol=1e-6)


def make_classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
