"""Measured choices: batch search, loader tuning, and their cache (the probe's stages: tests/engine/test_measured_plan.py)."""

import json

import pytest
import torch
from torch.utils.data import Dataset

from gpufill.engine import batching as batching_module
from gpufill.engine.loop import fit
from gpufill.engine.plan import DataFacts, SpeedSettings, make_plan
from gpufill.engine.measure import BatchTrial, Measurement, TuneCache, candidate_sizes, loader_candidates, search_batch
from gpufill.engine.measure import cache as cache_module
from gpufill.engine.measure import probe as probe_module
from gpufill.engine.measure import loader as loader_module
from tests.fakes import CPU, H100
from tests.engine.test_fit import assert_same_weights, make_data, model

MIB = 2**20


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(batching_module, "free_memory_bytes", lambda hw: hw.total_memory_bytes)  # fake GPUs
    cache_module.clear_memory()
    yield
    cache_module.clear_memory()


def fake_device(peak_at=256, mib_per_sample=1.0, base_mib=50.0, oom_above=None):
    """A cost model: throughput rises with the batch, peaks at `peak_at`, then falls; memory grows linearly."""
    calls = []

    def measure(size):
        calls.append(size)
        if oom_above is not None and size > oom_above:
            return BatchTrial(size=size, samples_per_s=None)
        rate = 1000 * size / (size + 64) * min(1.0, (peak_at / size) ** 0.5)
        return BatchTrial(size=size, samples_per_s=rate, peak_bytes=int((base_mib + mib_per_sample * size) * MIB))

    return measure, calls


def true_rate(size, peak_at=256):
    return 1000 * size / (size + 64) * min(1.0, (peak_at / size) ** 0.5)


def test_candidate_sizes_are_powers_of_two_up_to_the_limit():
    assert candidate_sizes(8, 128) == [8, 16, 32, 64, 128]
    assert candidate_sizes(16, 100) == [16, 32, 64, 100]
    assert candidate_sizes(256, 128) == [128]


def test_search_picks_the_throughput_optimum_below_the_memory_limit():
    measure, calls = fake_device(peak_at=256)
    budget = int(0.85 * 2048 * MIB)  # room for ~1700 samples: the peak (256) is well below
    result = search_batch(measure, start=8, limit=4096, budget_bytes=budget)
    assert result.best.size == 256
    assert result.best.samples_per_s == pytest.approx(true_rate(256))
    # Not "the largest that fits": 1024 fits but is slower, and the walk stopped after the peak.
    assert 1024 in calls and 2048 not in calls
    assert {192, 384} <= set(calls)  # refinement around the best power of two
    assert all(t.peak_bytes <= budget for t in result.trials if t.size == result.best.size)


def test_search_never_exceeds_the_memory_margin():
    measure, calls = fake_device(peak_at=1024, mib_per_sample=1.0)
    budget = int(0.85 * 400 * MIB)  # 340 MiB: at most 290 samples fit (50 MiB base)
    result = search_batch(measure, start=8, limit=4096, budget_bytes=budget)
    assert result.best.size == 256  # the fastest that fits; 384 (refinement) and 512 do not
    assert result.best.peak_bytes <= budget
    assert max(calls) == 512  # the first size over the budget ends the walk


def test_out_of_memory_ends_the_walk_and_nothing_fitting_is_an_input_error():
    measure, _ = fake_device(peak_at=4096, oom_above=100)
    assert search_batch(measure, start=8, limit=1024, budget_bytes=None).best.size == 96
    measure, _ = fake_device(oom_above=4)
    with pytest.raises(Exception, match="does not fit"):
        search_batch(measure, start=8, limit=64, budget_bytes=None)


def fixed_rates(rates):
    """A probe replacement: a fixed samples/s per micro-batch size (deterministic choices in fit tests)."""
    calls = []

    def measure(self, plan, *, timed_steps, check, limit=None):
        size, effective = plan.micro_batch.value, plan.effective_batch.value
        if plan.micro_batch.reason == "measuring":  # the batch search's, not the probe's other stages
            calls.append((size, effective))
        return Measurement(step_s=effective / rates.get(size, 1.0), losses=(1.0,) * 3 if check else ())

    return measure, calls


def test_search_keeps_the_effective_batch_through_accumulation(monkeypatch):
    measure, calls = fixed_rates({4: 100.0, 8: 300.0, 16: 200.0, 32: 150.0, 64: 120.0, 6: 10.0, 12: 10.0})
    monkeypatch.setattr(probe_module.FitProbe, "measure", measure)
    x, y = make_data()
    result = fit(model(), (x, y), epochs=1, batch_size=64, batch_search=True)
    assert result.plan.effective_batch.value == 64
    assert result.plan.micro_batch.value == 8 and result.plan.accumulation.value == 8
    assert result.plan.lr_scale.value == 1.0
    assert "fastest measured" in result.plan.micro_batch.reason and "8: 300/s" in result.plan.micro_batch.reason
    assert all(effective == 64 for _, effective in calls)  # every size was measured at the user's batch
    # The same update as a training that asked for micro-batch 8 itself.
    reference = fit(model(), (x, y), epochs=1, batch_size=64, micro_batch=8)
    assert_same_weights(result.model, reference.model, atol=1e-6)


def test_the_search_leaves_model_optimizer_and_random_state_untouched():
    """Real measurements: the search's steps must not change what training starts from."""
    x, y = make_data(n=512)
    torch.manual_seed(5)
    searched = fit(model(dropout=0.2), (x, y), epochs=2, batch_size=64, batch_search=True, seed=3)
    chosen = searched.plan.micro_batch.value
    assert searched.plan.batch_search.value and "measured" in searched.plan.micro_batch.reason
    torch.manual_seed(5)
    plain = fit(model(dropout=0.2), (x, y), epochs=2, batch_size=64, micro_batch=chosen, seed=3)
    assert_same_weights(searched.model, plain.model)


def test_allowing_the_effective_batch_to_change_scales_the_learning_rate(monkeypatch):
    measure, _ = fixed_rates({32: 100.0, 64: 200.0, 128: 300.0, 256: 500.0, 512: 400.0, 192: 10.0, 384: 10.0})
    monkeypatch.setattr(probe_module.FitProbe, "measure", measure)
    x, y = make_data(n=2048)
    result = fit(model(), (x, y), epochs=1, batch_search=True, tune_effective_batch=True, lr=1e-3)
    assert result.plan.effective_batch.value == 256 and result.plan.accumulation.value == 1
    assert result.plan.lr_scale.value == pytest.approx(2.0)  # linear rule, reference batch 128
    assert result.history[0].lr == pytest.approx(2e-3)
    assert "tune_effective_batch" in result.plan.effective_batch.reason


def test_a_campaign_measures_once_per_shape(tmp_path, monkeypatch):
    measure, calls = fixed_rates({16: 500.0})
    monkeypatch.setattr(probe_module.FitProbe, "measure", measure)
    x, y = make_data()
    first = fit(model(), (x, y), epochs=1, batch_size=64, batch_search=True, tune_cache=tmp_path)
    measured = len(calls)
    assert measured >= 4 and (tmp_path / "tune-cache.json").exists()
    cache_module.clear_memory()  # as a new worker process would start
    second = fit(model(seed=1), (x, y), epochs=1, batch_search=True, batch_size=64, tune_cache=tmp_path)
    assert len(calls) == measured  # read from the workdir, not measured again
    assert second.plan.micro_batch.value == first.plan.micro_batch.value == 16
    assert "cached measurement" in second.plan.micro_batch.reason
    third = fit(model(), (x, y), epochs=1, batch_size=32, batch_search=True, tune_cache=tmp_path)
    assert len(calls) > measured and third.plan.effective_batch.value == 32  # another batch: measured


def test_the_environment_names_one_cache_for_every_fit_on_the_machine(tmp_path, monkeypatch):
    """GPUFILL_TUNE_CACHE: a user's second run of a shape (a new process) measures nothing; unset, nothing is written."""
    measure, calls = fixed_rates({16: 500.0})
    monkeypatch.setattr(probe_module.FitProbe, "measure", measure)
    x, y = make_data()
    monkeypatch.setenv("GPUFILL_TUNE_CACHE", str(tmp_path / "named"))
    (tmp_path / "named").mkdir()
    fit(model(), (x, y), epochs=1, batch_size=64, batch_search=True)
    measured = len(calls)
    assert measured >= 4 and list(json.loads((tmp_path / "named" / "tune-cache.json").read_text())) != []
    cache_module.clear_memory()  # as the next run's process starts
    again = fit(model(seed=1), (x, y), epochs=1, batch_search=True, batch_size=64)
    assert len(calls) == measured and "cached measurement" in again.plan.micro_batch.reason
    monkeypatch.delenv("GPUFILL_TUNE_CACHE")
    cache_module.clear_memory()
    assert TuneCache(None).path is None


def test_a_damaged_cache_is_measured_again(tmp_path):
    (tmp_path / "tune-cache.json").write_text("{not json")
    cache = TuneCache(tmp_path)
    assert cache.get("k", dict) is None
    cache.put("k", {"a": 1})
    assert TuneCache(tmp_path).get("k", dict) == {"a": 1}


def test_batch_search_is_planned_from_the_device_and_training_length():
    facts = DataFacts(n_train=10_000, bytes_total=10_000)
    cpu, gpu = make_plan(CPU, facts, SpeedSettings(), epochs=100), make_plan(H100, facts, SpeedSettings(), epochs=100)  # 79 steps per epoch
    assert not cpu.batch_search.value and "CPU" in cpu.batch_search.reason
    assert gpu.batch_search.value
    short = make_plan(H100, facts, SpeedSettings(), epochs=2)
    assert not short.batch_search.value and "only 158 optimizer steps" in short.batch_search.reason
    assert not make_plan(H100, facts, SpeedSettings()).batch_search.value  # no epochs: the length is not known
    forced = make_plan(CPU, facts, SpeedSettings(batch_search=True), epochs=1)
    assert forced.batch_search.value  # a request is kept
    assert not make_plan(H100, facts, SpeedSettings(micro_batch=16, batch_size=64)).batch_search.value


# -- loader -----------------------------------------------------------------------------------
class SlowWindows(Dataset):
    def __init__(self, n=512):
        self.x, self.y = make_data(n=n)

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_loader_candidates_follow_the_spare_cores():
    on_cpu = loader_candidates(CPU)  # 2 cores: one may feed, one computes
    assert [(c.num_workers, c.prefetch_factor) for c in on_cpu] == [(0, None), (1, 2), (1, 4)]
    assert not any(c.pin_memory for c in on_cpu)
    on_gpu = loader_candidates(H100)  # 16 cores
    assert sorted({c.num_workers for c in on_gpu}) == [0, 1, 2, 4, 8]
    assert all(c.pin_memory for c in on_gpu) and all(c.persistent_workers == (c.num_workers > 0) for c in on_gpu)


def test_the_fastest_loader_setting_is_kept(monkeypatch):
    rates = {(0, None): 50.0, (1, 2): 80.0, (1, 4): 95.0}
    monkeypatch.setattr(loader_module, "batches_per_second", lambda dataset, batch, s: rates[(s.num_workers, s.prefetch_factor)])
    choice = loader_module.tune_loader(SlowWindows(), 32, CPU)
    assert (choice.value.num_workers, choice.value.prefetch_factor) == (1, 4)
    assert "95 batches/s" in choice.reason and "0 workers: 50/s" in choice.reason


def test_fit_tunes_the_loader_for_a_long_dataset_training_only(monkeypatch):
    rates = {(0, None): 90.0, (1, 2): 20.0, (1, 4): 30.0}
    monkeypatch.setattr(loader_module, "batches_per_second", lambda dataset, batch, s: rates[(s.num_workers, s.prefetch_factor)])
    long = fit(model(), SlowWindows(), epochs=13, batch_size=32)  # 16 batches x 13 epochs = 208 >= 200
    assert long.plan.loader_tuning.value and long.plan.loader.value.num_workers == 0
    assert long.plan.loader.reason.startswith("measured fastest of 3")
    short = fit(model(), SlowWindows(), epochs=2, batch_size=32)
    assert not short.plan.loader_tuning.value and "would not pay back" in short.plan.loader_tuning.reason
    x, y = make_data()
    resident = fit(model(), (x, y), epochs=1)
    assert resident.plan.loader.value is None and resident.plan.loader_tuning.reason == "not needed: data is resident"


def test_measuring_a_real_loader_returns_a_rate():
    settings = loader_candidates(CPU)[0]
    assert loader_module.batches_per_second(SlowWindows(), 32, settings, batches=5) > 0
