"""fit_many at its edges: max_steps packed or not, factories that share modules, models built as late as the training
allows and packs split by memory, one checkpoint folder per variant, honest throughput, one-line errors."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import pytest
import torch
from torch import nn

import gpufill
from gpufill.engine.checkpoint import checkpoint_path
from tests.engine.common import classification, input_error, regression

EXACT = {"probe": False, "precision": "fp32", "threads": 1, "device": "cpu"}
SETTINGS = {**EXACT, "batch_size": 8, "epochs": 4}  # 64 rows: 8 steps an epoch


def _data():
    return regression(n=64)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _difference(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[n] - sb[n]).abs().max()) for n in sa)


def _alone(variant, make_model=_net, data=None, val=None, **settings):
    torch.manual_seed(variant["seed"])
    return gpufill.fit(make_model(), data or _data(), val, **{**settings, **variant})


VARIANTS = [{"seed": 0, "lr": 1e-2}, {"seed": 1, "lr": 3e-2}]


# -- item 1: max_steps ends a pack where it ends fit alone ------------------------------------------------------
@pytest.mark.parametrize("pack", [True, False, "auto"])
@pytest.mark.parametrize(("max_steps", "steps"), [(5, [5]), (13, [8, 5])], ids=["cut_in_epoch_1", "cut_in_epoch_2"])
def test_max_steps_ends_every_variant_where_fit_alone_ends_packed_or_not(pack, max_steps, steps):
    settings = {**SETTINGS, "max_steps": max_steps, "schedule": "warmup_cosine"}  # the schedule's length is max_steps too
    results = gpufill.fit_many(_net, _data(), variants=VARIANTS, pack=pack, **settings)
    for variant, result in zip(VARIANTS, results, strict=True):
        alone = _alone(variant, **settings)
        assert [r.steps for r in result.history] == [r.steps for r in alone.history] == steps
        assert [r.samples for r in result.history] == [8 * s for s in steps]
        assert _difference(result.model, alone.model) < 1e-5
        assert result.history[-1].lr == pytest.approx(alone.history[-1].lr, rel=1e-9)
        assert f"stopped at max_steps {max_steps} in epoch {len(steps)} ({steps[-1]} of its steps)" in result.events


# -- item 2: every variant its own tensors, built as late as the training allows ----------------------------------
class _Cached:
    """A factory that caches what it builds: the same module every call, or new modules sharing one submodule."""

    def __init__(self, share: str):
        self.share, self.module, self.body = share, None, None

    def __call__(self) -> nn.Module:
        if self.share == "module":
            self.module = self.module or _net()
            return self.module
        self.body = self.body or nn.Linear(4, 8)
        return nn.Sequential(self.body, nn.Tanh(), nn.Linear(8, 1))


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("share", ["module", "submodule"])
def test_a_factory_sharing_modules_trains_each_variant_on_its_own_copy_from_the_factorys_weights(share, pack):
    factory = _Cached(share)
    results = gpufill.fit_many(factory, _data(), variants=VARIANTS + [{"seed": 2, "lr": 2e-2}], pack=pack, **SETTINGS)
    models = [r.model for r in results]
    storages = [{p.untyped_storage().data_ptr() for p in m.parameters()} for m in models]
    assert not storages[0] & storages[1] and not storages[1] & storages[2] and not storages[0] & storages[2]  # no result aliases another
    for index, result in enumerate(results):  # each as fit trains a copy of what the factory returned for it
        replay = _Cached(share)
        for seed in range(index + 1):
            torch.manual_seed(seed)
            returned = replay()
        variant = [*VARIANTS, {"seed": 2, "lr": 2e-2}][index]
        alone = gpufill.fit(copy.deepcopy(returned), _data(), **{**SETTINGS, **variant})
        assert _difference(result.model, alone.model) < 1e-5, index
        if share == "module":  # the factory's own module was never trained
            assert _difference(factory.module, returned) == 0.0


def test_a_factory_cycling_through_cached_modules_is_refused_once_a_shared_one_has_trained():
    cache = [_net(), _net()]
    calls = iter([0, 1, 0])  # variant 2 gets variant 0's module back, trained
    error = input_error(gpufill.fit_many, lambda: cache[next(calls)], _data(), variants=[{"seed": s} for s in range(3)], pack=False,
                        field="make_model", contains=("variant 2", "variant 0's trained weights", "build a new module on every call"),
                        **SETTINGS)
    assert "deepcopy" in str(error)


@pytest.mark.parametrize(("pack", "at_most"), [(False, 2), (True, 4)], ids=["one_at_a_time", "packs_of_3"])
@pytest.mark.slow
def test_models_are_built_as_late_as_the_training_allows(monkeypatch, pack, at_most):
    from gpufill.engine.packs import builds
    # One at a time: the model training and the next one (built ahead to see whether it shares tensors). Packed, with
    # the memory free for 3 models: a pack of 3 and the next one.
    per_model = builds.PACK_COPIES * sum(p.numel() * 4 for p in _net().parameters())
    monkeypatch.setattr(builds, "free_memory_bytes", lambda hardware: int(3.5 * per_model / (builds.PACK_MEMORY_SHARE * 0.85)))
    alive: weakref.WeakSet[nn.Module] = weakref.WeakSet()
    most = []

    def factory():
        gc.collect()
        most.append(len(alive))
        model = _net()
        alive.add(model)
        return model

    variants = [{"seed": s} for s in range(8)]
    results = gpufill.fit_many(factory, _data(), variants=variants, pack=pack, keep_models=False, **{**SETTINGS, "epochs": 1})
    assert len(most) == 8 and max(most) <= at_most - 1, most  # before the fix: 0, 1, ..., 7 alive at the calls
    assert all(r.model is None for r in results) and all(r.metrics["epochs_run"] == 1 for r in results)
    if pack:
        assert [r.plan.pack_size.value for r in results] == [3, 3, 3, 3, 3, 3, 2, 2]
        reason = results[0].plan.pack_size.reason
        assert reason.startswith("one pack of 3 (") and "; 8 variants in packs of at most 3: a pack holds about 1.5 KiB per model (8 copies of its weights)" in reason


def test_packs_split_by_memory_end_where_each_variant_ends_alone(monkeypatch):
    from gpufill.engine.packs import builds
    per_model = builds.PACK_COPIES * sum(p.numel() * 4 for p in _net().parameters())
    monkeypatch.setattr(builds, "free_memory_bytes", lambda hardware: int(2.5 * per_model / (builds.PACK_MEMORY_SHARE * 0.85)))
    variants = [{"seed": s, "lr": 1e-2 * (s + 1)} for s in range(4)]
    results = gpufill.fit_many(_net, _data(), variants=variants, pack=True, **SETTINGS)
    assert [r.plan.pack_size.value for r in results] == [2, 2, 2, 2]
    for variant, result in zip(variants, results, strict=True):
        assert _difference(result.model, _alone(variant, **SETTINGS).model) < 1e-5


def test_a_pack_is_capped_whatever_memory_is_free(monkeypatch):
    """Done-when: a pack=True of 100 big models is split although the memory would hold it (this box: 22 GiB free);
    shrunk here to 6 variants and a cap of 2 models' worth, on the real free memory."""
    from gpufill.engine.packs import builds
    per_model = builds.PACK_COPIES * sum(p.numel() * 4 for p in _net().parameters())
    monkeypatch.setattr(builds, "PACK_MAX_BYTES", int(2.5 * per_model))
    assert builds.free_memory_bytes(builds.detect("cpu")) * builds.PACK_MEMORY_SHARE * 0.85 > 100 * builds.PACK_MAX_BYTES  # room for far more
    variants = [{"seed": s, "lr": 1e-2 * (s + 1)} for s in range(6)]
    results = gpufill.fit_many(_net, _data(), variants=variants, pack=True, **SETTINGS)
    assert [r.plan.pack_size.value for r in results] == [2] * 6
    assert "compute-bound alone, so smaller packs lose nothing" in results[0].plan.pack_size.reason


def test_a_hundred_4_mb_models_go_in_four_packs_of_25():
    from types import SimpleNamespace

    from gpufill.engine.packs import builds
    free = builds.free_memory_bytes(builds.detect("cpu"))
    if free * builds.PACK_MEMORY_SHARE * 0.85 < builds.PACK_MAX_BYTES:
        pytest.skip("less memory free than the cap: the free memory decides here")
    size, why = builds.pack_chunk(nn.Linear(1024, 1024), SimpleNamespace(device="cpu", memory_margin=0.85), 100)
    assert size == 25 and why.startswith("100 variants in packs of at most 25: a pack holds about 32.0 MiB per model")


# -- item 3: one checkpoint folder per variant; a resume with other settings is refused ----------------------------
def test_each_variant_checkpoints_in_its_own_folder_and_resumes_from_its_own(tmp_path):
    variants = [{"seed": s, "lr": lr} for s, lr in [(0, 1e-2), (1, 3e-2), (2, 2e-2)]]
    gpufill.fit_many(_net, _data(), variants=variants, checkpoint_dir=tmp_path, **{**SETTINGS, "epochs": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variant-0", "variant-1", "variant-2"]
    for index, variant in enumerate(variants):
        meta = json.loads((tmp_path / f"variant-{index}" / "meta.json").read_text())
        assert meta["identity"]["settings"]["seed"] == variant["seed"] and meta["identity"]["settings"]["lr"] == variant["lr"]
    resumed = gpufill.fit_many(_net, _data(), variants=variants, checkpoint_dir=tmp_path, resume=True, **SETTINGS)
    straight = gpufill.fit_many(_net, _data(), variants=variants, pack=False, **SETTINGS)
    for index, (again, once) in enumerate(zip(resumed, straight, strict=True)):
        assert f"resumed after epoch 2 from {tmp_path / f'variant-{index}'}" in again.events
        assert _difference(again.model, once.model) < 1e-6, index


@pytest.mark.parametrize(("change", "kept"), [({"lr": 0.02}, "lr=0.01"), ({"seed": 12}, "seed=11"), ({"grad_clip": 1.0}, "grad_clip=None"),
                                              ({"batch_size": 16}, "batch_size=8")])
def test_resuming_with_another_lr_seed_or_setting_is_refused_naming_the_file_and_setting(tmp_path, change, kept):
    settings = {**SETTINGS, "epochs": 2, "lr": 0.01, "seed": 11}
    gpufill.fit(_net(), _data(), checkpoint_dir=tmp_path, **settings)
    (name,) = change
    input_error(gpufill.fit, _net(), _data(), checkpoint_dir=tmp_path, resume=True, **{**settings, **change, "epochs": 3}, field=name,
                contains=(str(checkpoint_path(tmp_path)), f"written with {kept}", f"resume with {kept}", "checkpoint_dir"))
    again = gpufill.fit(_net(), _data(), checkpoint_dir=tmp_path, resume=True, **{**settings, "epochs": 3})  # the same settings resume
    assert "resumed after epoch 2" in " ".join(again.events) and len(again.history) == 3


# -- item 6: samples per second counts what a cut epoch trained -----------------------------------------------------
def test_throughput_is_the_steady_epochs_samples_over_their_seconds():
    from gpufill.engine.result import throughput
    # Epoch 1 warms up; epoch 4 was cut by max_steps after one step of 8 samples.
    rate, epoch_s = throughput([1.0, 0.8, 0.8, 0.1], [64, 64, 64, 8])
    assert rate == pytest.approx(136 / 1.7) and epoch_s == pytest.approx(0.8)  # before: 8 samples / 0.567 s = 14 samples/s
    assert throughput([0.5], [40]) == (pytest.approx(80.0), pytest.approx(0.5))
    assert throughput([], []) == (0.0, 0.0)


@pytest.mark.parametrize("how", ["fit", "pack"])
def test_reported_throughput_is_what_the_epochs_trained_when_max_steps_cuts_the_last(how):
    settings = {**SETTINGS, "epochs": 6, "max_steps": 33}  # 4 whole epochs, then one step
    if how == "fit":
        result = gpufill.fit(_net(), _data(), **settings)
    else:
        result = gpufill.fit_many(_net, _data(), variants=VARIANTS, pack=True, **settings)[0]
    steady = result.history[1:]
    assert [r.samples for r in steady] == [64, 64, 64, 8]
    assert result.timings["samples_per_s"] == pytest.approx(sum(r.samples for r in steady) / sum(r.seconds for r in steady), rel=1e-6)
    assert result.timings["epoch_s"] == pytest.approx(64 / result.timings["samples_per_s"], rel=1e-6)


# -- item 12: bad variants are one line -----------------------------------------------------------------------------
@pytest.mark.parametrize(("variants", "words"), [([1, 2], "variants[0] is 1 (a int)"), (["seed"], "variants[0] is 'seed' (a str)"),
                                                 ("seed", "variants is a str"), ({"seed": 0}, "variants is a dict"),
                                                 ([{"seed": 0}, None], "variants[1] is None"), ([{1: 2}], "not a setting name"),
                                                 ([], "no variants")])
def test_bad_variants_are_one_input_error_naming_the_fix(variants, words):
    input_error(gpufill.fit_many, _net, _data(), variants=variants, **SETTINGS, field="variants", contains=(words, "variants=[{'seed': 0}"))


# -- item 7: a bias before BatchNorm -------------------------------------------------------------------------------
class BiasBeforeBatchNorm(nn.Module):
    """The common layout: a Linear with its bias, then BatchNorm, which subtracts the batch mean and so the bias."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def test_a_bias_before_batchnorm_drifts_in_a_pack_but_the_training_and_every_other_weight_match_training_alone():
    # The bias's gradient is zero up to rounding, which AdamW normalises into steps of up to ~3 lr of either sign (the
    # pack and fit round differently): the bias drifts apart, and BatchNorm's running mean, which tracks it, with it.
    # Training subtracts the batch's own mean, so the training itself (losses, train-mode outputs, every other weight)
    # matches to float rounding; eval mode subtracts the running mean, so eval outputs and the validation loss match
    # only as closely as the drift allows (measured: 0.015 in an output, 0.23 % in the validation loss).
    x, labels = classification(n=160)
    data = {"train": (x[:128], labels[:128]), "val": (x[128:], labels[128:])}
    settings = {**EXACT, "loss": "cross_entropy", "batch_size": 32, "epochs": 3}  # 12 steps
    variants = [{"seed": s, "lr": lr} for s, lr in [(0, 1e-2), (1, 3e-3), (2, 1e-3), (3, 5e-3)]]
    packed = gpufill.fit_many(BiasBeforeBatchNorm, data["train"], data["val"], variants=variants, pack=True, **settings)
    drifting = {"net.0.bias", "net.1.running_mean"}
    for variant, result in zip(variants, packed, strict=True):
        torch.manual_seed(variant["seed"])
        alone = gpufill.fit(BiasBeforeBatchNorm(), data["train"], data["val"], **{**settings, **variant})
        a, b = result.model.state_dict(), alone.model.state_dict()
        assert max(float((a[n] - b[n]).abs().max()) for n in a if n not in drifting) < 1e-5  # every other weight and buffer
        assert float((a["net.0.bias"] - b["net.0.bias"]).abs().max()) <= 3.2 * variant["lr"] * 12  # Adam's largest steps, no more
        assert [r.train_loss for r in result.history] == pytest.approx([r.train_loss for r in alone.history], rel=1e-6)
        result.model.train(), alone.model.train()
        with torch.no_grad():  # the function training sees: batch statistics cancel the bias
            torch.testing.assert_close(result.model(data["val"][0]), alone.model(data["val"][0]), rtol=0, atol=1e-5)
        result.model.eval(), alone.model.eval()
        with torch.no_grad():
            torch.testing.assert_close(result.model(data["val"][0]), alone.model(data["val"][0]), rtol=0, atol=0.05)
        assert result.metrics["val_loss"] == pytest.approx(alone.metrics["val_loss"], rel=1e-2)


def test_without_the_bias_before_batchnorm_eval_outputs_and_validation_loss_match_too():
    # The layout README recommends (bias=False before BatchNorm, as WithBatchNorm in test_many.py): nothing drifts.
    x, labels = classification(n=160)
    data = {"train": (x[:128], labels[:128]), "val": (x[128:], labels[128:])}
    settings = {**EXACT, "loss": "cross_entropy", "batch_size": 32, "epochs": 3}
    variants = [{"seed": 0, "lr": 1e-2}, {"seed": 3, "lr": 5e-3}]

    def make():
        return nn.Sequential(nn.Linear(4, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    packed = gpufill.fit_many(make, data["train"], data["val"], variants=variants, pack=True, **settings)
    for variant, result in zip(variants, packed, strict=True):
        alone = _alone(variant, make, data["train"], val=data["val"], **settings)
        assert _difference(result.model, alone.model) < 1e-5
        result.model.eval(), alone.model.eval()
        with torch.no_grad():
            torch.testing.assert_close(result.model(data["val"][0]), alone.model(data["val"][0]), rtol=0, atol=1e-5)
        assert result.metrics["val_loss"] == pytest.approx(alone.metrics["val_loss"], rel=1e-5)


def test_a_link_in_place_of_a_variants_checkpoint_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    """bd3c8d8: with `D/variant-0` a symlink, fit_many wrote meta.json, last.pt and the lock through it."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "variant-0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(gpufill.InputError) as refused:
        gpufill.fit_many(_net, _data(), variants=[{"seed": 0}, {"seed": 1}], checkpoint_dir=tmp_path / "ckpt", **{**SETTINGS, "epochs": 1})
    assert refused.value.field == "checkpoint_dir" and "variant-0" in refused.value.one_line() and "link" in refused.value.one_line()
    assert list((tmp_path / "elsewhere").iterdir()) == []  # nothing through the link
