import json
import os
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gpufill.errors import InputError
from gpufill.engine.loop import fit
from gpufill.engine.result import FitCallback


def make_data(n=256, features=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, features, generator=g)
    y = x[:, -3:, :1].mean(dim=1) * 2 + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


class Tiny(nn.Module):
    def __init__(self, features=4, dropout=0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(8 * features, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


def model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return Tiny(dropout=dropout)


def assert_same_weights(a: nn.Module, b: nn.Module, atol=0.0):
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        if atol == 0.0:
            assert torch.equal(pa, pb), name
        else:
            torch.testing.assert_close(pa, pb, atol=atol, rtol=0, msg=name)


def test_training_reduces_the_loss_and_reports_timings():
    x, y = make_data()
    result = fit(model(), (x[:200], y[:200]), (x[200:], y[200:]), epochs=8, lr=3e-3, batch_size=32)
    losses = [record.train_loss for record in result.history]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0]
    assert result.status == "completed" and result.metrics["epochs_run"] == 8
    assert result.timings["samples_per_s"] > 0 and result.timings["epoch_s"] > 0
    assert result.plan.data_placement.value == "device"


def test_accumulation_equals_one_big_batch():
    x, y = make_data()
    whole = fit(model(), (x, y), epochs=3, batch_size=128, grad_clip=None)
    accumulated = fit(model(), (x, y), epochs=3, batch_size=128, micro_batch=32, grad_clip=None)
    assert accumulated.plan.accumulation.value == 4
    assert_same_weights(whole.model, accumulated.model, atol=1e-5)


def test_accumulation_with_a_short_last_micro_batch():
    x, y = make_data(n=250)
    whole = fit(model(), (x, y), epochs=2, batch_size=100, grad_clip=1.0)
    accumulated = fit(model(), (x, y), epochs=2, batch_size=100, micro_batch=30, grad_clip=1.0)  # 30+30+30+10
    assert_same_weights(whole.model, accumulated.model, atol=1e-5)


class CrashAfter(Exception):
    pass


def test_resume_ends_with_the_same_weights_as_an_uninterrupted_run(tmp_path):
    x, y = make_data()
    train, val = (x[:200], y[:200]), (x[200:], y[200:])
    settings = dict(epochs=6, batch_size=32, checkpoint_every=1, seed=7)
    straight = fit(model(dropout=0.2), train, val, checkpoint_dir=tmp_path / "a", **settings)

    class CrashAt3(FitCallback):
        def on_epoch_end(self, record):
            if record.epoch == 3:
                raise CrashAfter

    with pytest.raises(CrashAfter):
        fit(model(dropout=0.2), train, val, checkpoint_dir=tmp_path / "b", callbacks=[CrashAt3()], **settings)
    resumed = fit(model(seed=99, dropout=0.2), train, val, checkpoint_dir=tmp_path / "b", resume=True, **settings)
    assert any("resumed after epoch 3" in event for event in resumed.events)
    assert [r.epoch for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert [r.train_loss for r in resumed.history] == [r.train_loss for r in straight.history]
    assert_same_weights(straight.model, resumed.model)


def test_a_callback_that_stops_the_training_ends_it_pruned_at_that_epoch_with_the_weights_it_had():
    x, y = make_data()
    train, val = (x[:200], y[:200]), (x[200:], y[200:])
    settings = dict(epochs=6, batch_size=32, seed=3, restore_best=False)

    class StopAt3(FitCallback):
        def stop(self, record):
            return "the pruner said so" if record.epoch == 3 else None

    straight = fit(model(), train, val, epochs=3, **{k: v for k, v in settings.items() if k != "epochs"})
    stopped = fit(model(), train, val, callbacks=[StopAt3()], **settings)
    assert stopped.status == "pruned" and [r.epoch for r in stopped.history] == [1, 2, 3]
    assert "pruned at epoch 3: the pruner said so" in stopped.events
    assert [r.val_loss for r in stopped.history] == [r.val_loss for r in straight.history]
    assert_same_weights(straight.model, stopped.model)


def test_resume_without_a_checkpoint_starts_fresh(tmp_path):
    x, y = make_data()
    result = fit(model(), (x, y), epochs=1, checkpoint_dir=tmp_path, resume=True)
    assert result.events[0].startswith("resume: no checkpoint yet")
    assert (tmp_path / "last.pt").exists()


@pytest.mark.parametrize("where", ["wrap", "first_call"])
def test_compile_error_falls_back_to_eager_with_the_reason(monkeypatch, where):
    def broken_compile(module, **kwargs):
        if where == "wrap":
            raise RuntimeError("no compiler here")

        def call(*args):
            raise RuntimeError("backend exploded")

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    x, y = make_data()
    eager = fit(model(), (x, y), epochs=2, compile=False)
    fallback = fit(model(), (x, y), epochs=2, compile=True)
    assert fallback.plan.compile.value is False
    assert "fell back to eager" in fallback.plan.compile.reason
    assert ("no compiler here" if where == "wrap" else "backend exploded") in fallback.plan.compile.reason
    assert_same_weights(eager.model, fallback.model)


class OomAbove(nn.Module):
    """Raises the CUDA out-of-memory error for batches larger than `limit`, like a real GPU would."""

    def __init__(self, inner, limit):
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.inner(x)


def test_out_of_memory_halves_the_micro_batch_and_retries_the_same_step():
    x, y = make_data()
    reference = fit(model(), (x, y), epochs=2, batch_size=128, micro_batch=32)
    recovered = fit(OomAbove(model(), limit=40), (x, y), epochs=2, batch_size=128)
    assert recovered.plan.micro_batch.value == 32 and recovered.plan.accumulation.value == 4
    assert "halved from 64" in recovered.plan.micro_batch.reason
    ooms = [e for e in recovered.events if e.startswith("out of memory")]
    assert len(ooms) == 2  # 128 -> 64 -> 32, then no more errors
    assert_same_weights(reference.model, recovered.model.inner, atol=1e-6)


def test_hot_loop_reads_the_device_once_per_epoch_and_per_validation(monkeypatch):
    """Counts gpufill's own device reads (.item/.cpu/.tolist); torch's optimizers read CPU step counters."""
    calls = []

    def counting(name):
        real = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if os.sep + "gpufill" + os.sep in caller:
                calls.append(name)
            return real(self, *args, **kwargs)

        return wrapper

    for name in ("item", "cpu", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    x, y = make_data()
    fit(model(), (x[:200], y[:200]), (x[200:], y[200:]), epochs=5, batch_size=16, validate_every=2, probe=False)
    # (The probe reads its checked steps' losses before the first epoch: not the hot loop.) 13 steps per epoch; reads (loss and sample count in one transfer): 5 epochs + validations at epochs 2, 4, 5.
    assert calls == ["tolist"] * (5 + 3)
    calls.clear()
    fit(model(), (x[:200], y[:200]), epochs=2, batch_size=16, sync_every_step=True)
    assert calls == (["item"] * 13 + ["tolist"]) * 2  # the ablation's per-step read, then the epoch's


def test_early_stopping_restores_the_best_weights():
    x, y = make_data()
    # Validation targets are the negated train targets: fitting train makes val worse.
    # fp32 pinned: the val loss below is recomputed in fp32, and on a bf16 CPU the live trial may train (and validate) in
    # bf16 when its first steps measure it faster (a loaded clean-clone CI did: 4e-4 apart).
    result = fit(model(), (x[:200], y[:200]), (x[200:], -y[200:]), epochs=20, lr=1e-2, patience=2, precision="fp32")
    assert result.status == "early_stopped"
    best = result.metrics["best_epoch"]
    assert result.metrics["epochs_run"] == best + 2
    with torch.no_grad():
        val_loss = nn.functional.mse_loss(result.model(x[200:]), -y[200:]).item()
    assert val_loss == pytest.approx(result.metrics["val_loss"], rel=1e-5)
    assert any("restored the best weights" in e for e in result.events)


def test_nan_loss_marks_the_run_diverged():
    x, y = make_data()
    y[5] = float("nan")
    result = fit(model(), (x, y), epochs=3)
    assert result.status == "diverged" and result.metrics["epochs_run"] == 1
    assert "diverged at epoch 1" in result.events[0]


class SlowDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_a_dataset_trains_through_a_dataloader():
    x, y = make_data()
    result = fit(model(), SlowDataset(x, y), SlowDataset(x[:50], y[:50]), epochs=4, lr=3e-3)
    assert result.plan.data_placement.value == "loader"
    assert result.plan.loader.value.num_workers in (0, 1)  # few cores: no competing workers
    assert result.history[-1].train_loss < result.history[0].train_loss
    assert result.history[-1].val_loss is not None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"validate_every": 0}, "validate_every"),
        ({"resume": True}, "resume"),
        ({"patience": -1}, "patience"),
        ({"loss": "cosine"}, "loss"),
        ({"learning_rate": 1e-3}, "fit"),
        ({"batch_size": -4}, "batch_size"),
    ],
)
def test_bad_settings_are_clear_errors(overrides, field):
    x, y = make_data()
    with pytest.raises(InputError) as error:
        fit(model(), (x, y), **overrides)
    assert field in str(error.value) and "fix:" in str(error.value)


def test_mismatched_data_and_output_shapes_are_clear_errors():
    x, y = make_data()
    with pytest.raises(InputError, match="samples"):
        fit(model(), (x, y[:10]))
    with pytest.raises(InputError, match="returns shape"):
        fit(model(), (x, torch.zeros(len(x), 3)))
    with pytest.raises(InputError, match="expected tensors"):
        fit(model(), "train.csv")


def test_backend_flags_are_restored_after_fit():
    before = torch.backends.cudnn.benchmark
    x, y = make_data()
    fit(model(), (x, y), epochs=1, cudnn_benchmark=not before)
    assert torch.backends.cudnn.benchmark == before


def test_checkpoint_is_written_atomically(tmp_path, monkeypatch):
    x, y = make_data()
    fit(model(), (x, y), epochs=2, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpufill-training.lock", "last.pt", "meta.json"]  # no .tmp left behind
    saved = torch.load(tmp_path / "last.pt", weights_only=True)  # tensors and plain containers only
    meta = json.loads(saved["meta_json"])
    assert meta["state"]["epoch"] == 2 and json.loads((tmp_path / "meta.json").read_text()) == meta


def test_fit_feeds_a_training_monitor_every_step():
    from gpufill.monitor.training import TrainingMonitor

    x, y = make_data()
    monitor = TrainingMonitor()
    with monitor:
        fit(model(), (x, y), epochs=3, batch_size=64, monitor=monitor)
    summary = monitor.summary()
    assert summary["iterations"] == 3 * 4  # 256 samples / 64 per step, 3 epochs
    assert summary["samples"] == 3 * 256
    assert 0 <= summary["data_wait_share"] < 0.5 and summary["step_s_p95"] >= summary["step_s_p50"] > 0


def test_the_plan_reports_the_set_up_from_the_call_to_the_first_epoch():
    """Checks, plan, data to the device, the probe and the kit: what a user waits for before the first epoch, in the
    plan and the timings; with the epochs it makes up the call's time."""
    import time

    from tests.engine.common import mlp, regression

    x, y = regression(n=256)
    tick = time.perf_counter()
    result = fit(mlp(), (x[:192], y[:192]), (x[192:], y[192:]), device="cpu", epochs=2, batch_size=16, precision="fp32")
    outside = time.perf_counter() - tick
    setup = result.timings["setup_s"]
    assert 0 < setup and setup >= result.timings["probe_s"]
    assert setup + result.timings["train_s"] <= outside
    assert f"set-up {setup:.2f} s from the fit call to the first epoch" in result.plan.probe.reason
