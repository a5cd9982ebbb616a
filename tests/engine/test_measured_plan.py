"""The measured plan: the resolver's decisions on chosen timings (a fake probe and clock), and the real
probe on CPU trainings: an injected slow candidate loses, an erroring one is dropped, a low precision
that moves the loss keeps fp32, and the probe leaves the training bit-identical to one without it."""

from __future__ import annotations

import time

import pytest
import torch

from gpufill.engine import batching as batching_module
from gpufill.engine.config import FitConfig, SpeedSettings
from gpufill.engine.loop import fit
from gpufill.engine.measure import cache as cache_module
from gpufill.engine.measure import probe as probe_module
from gpufill.engine.measure import resolver as resolver_module
from gpufill.engine.measure.candidates import Context
from gpufill.engine.measure.resolver import CHECK_STEPS, Measurement, TuneCache, label, resolve
from gpufill.engine.plan import DataFacts, make_plan
from tests.engine.common import assert_same_weights, mlp, regression
from tests.fakes import CPU, H100

RESIDENT = Context(resident=True, distributed=False, optimizer="built-in")


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(batching_module, "free_memory_bytes", lambda hw: hw.total_memory_bytes)  # fake GPUs
    cache_module.clear_memory()
    yield
    cache_module.clear_memory()


class FakeProbe:
    """Timings chosen by the test: a base step time times a factor per (setting, value); a fake clock
    advances by what each measurement would take."""

    def __init__(self, factors=None, *, base=0.01, losses=None, errors=()):
        self.factors = factors or {}
        self.base = base
        self.losses = losses or {}
        self.errors = set(errors)
        self.now = 0.0
        self.calls: list[str] = []

    def clock(self) -> float:
        return self.now

    def measure(self, plan, *, timed_steps, check, limit=None):
        self.calls.append(label(plan))
        values = {(name, getattr(plan, name).value) for name in ("threads", "precision", "tf32", "cudnn_benchmark", "optimizer_kernel",
                                                                   "step_graph", "compile")}
        step_s = self.base
        for key, factor in self.factors.items():
            if key in values:
                step_s *= factor
        self.now += ((CHECK_STEPS if check else 1) + timed_steps) * step_s
        if values & self.errors:
            return Measurement(None, error="RuntimeError: cannot run this candidate")
        drift = next((d for key, d in self.losses.items() if key in values), 0.0)
        return Measurement(step_s, tuple(1.0 + drift for _ in range(CHECK_STEPS)) if check else ())

    def release(self) -> None:
        pass


def resolved(probe, *, hardware=H100, settings=None, total_steps=10_000, cache=None, key=None, context=RESIDENT):
    """The finished plan from `probe`'s timings (a key of its own unless given: the cache is per process)."""
    settings = settings or SpeedSettings(batch_search=False)  # the batch search has its own tests (test_tune.py)
    facts = DataFacts(n_train=100_000, bytes_total=1)
    plan = make_plan(hardware, facts, settings, epochs=1)
    events: list[str] = []
    plan = resolve(plan, probe, settings=settings, hardware=hardware, facts=facts, context=context, total_steps=total_steps,
                   cache=cache or TuneCache(None), key=key or f"test-{id(probe)}-{total_steps}", events=events, clock=probe.clock)
    return plan, events


def test_the_faster_candidate_wins_and_its_reason_carries_the_numbers(monkeypatch):
    monkeypatch.setattr("gpufill.engine.plan.torch.get_num_threads", lambda: 16)
    probe = FakeProbe({("precision", "bf16"): 1.4, ("step_graph", True): 1 / 3, ("cudnn_benchmark", True): 0.99,
                       ("compile", "default"): 2.0, ("compile", "reduce-overhead"): 1.5})
    plan, events = resolved(probe, total_steps=100_000)  # 1000 s expected: room for a compile
    assert plan.precision.value == "fp32"
    assert plan.precision.reason.startswith("fp32 kept: measured 10 ms per step") and "bf16 0.71x" in plan.precision.reason
    assert plan.step_graph.value and plan.step_graph.reason.startswith("measured 3.00x eager steps")
    assert not plan.cudnn_benchmark.value and "cudnn_benchmark on 1.01x" in plan.cudnn_benchmark.reason  # under MIN_GAIN: the plain value stays
    assert not plan.compile.value and "compile (default) 0.17x" in plan.compile.reason
    assert plan.optimizer_kernel.value == "fused" and "foreach optimizer 1.00x" in plan.optimizer_kernel.reason
    assert plan.probe.value > 0 and "measurements in" in plan.probe.reason
    assert any(e.startswith("precision: fp32 kept") for e in events)


def test_a_candidate_that_errors_is_dropped_with_its_reason():
    probe = FakeProbe({("precision", "bf16"): 0.5}, errors={("precision", "fp16")})
    plan, _ = resolved(probe)
    assert plan.precision.value == "bf16"
    assert "fp16 dropped (RuntimeError: cannot run this candidate)" in plan.precision.reason


def test_a_low_precision_that_moves_the_loss_beyond_tolerance_keeps_fp32():
    probe = FakeProbe({("precision", "bf16"): 0.5, ("precision", "fp16"): 0.4}, losses={("precision", "bf16"): 0.05, ("precision", "fp16"): 0.5})
    plan, _ = resolved(probe)
    assert plan.precision.value == "fp32" and not plan.grad_scaler.value
    assert "bf16 2.00x but dropped: its loss differs by 5.0% from the reference's (tolerance 2%)" in plan.precision.reason
    close = FakeProbe({("precision", "bf16"): 0.5}, losses={("precision", "bf16"): 0.005})
    assert resolved(close)[0].precision.value == "bf16"  # within tolerance: the faster one


def test_fp16_brings_its_loss_scaler_and_then_no_step_graph():
    plan, _ = resolved(FakeProbe({("precision", "fp16"): 0.5, ("step_graph", True): 0.2}))
    assert plan.precision.value == "fp16" and plan.grad_scaler.value
    assert not plan.step_graph.value and "not measured: fp16 loss scaling" in plan.step_graph.reason


def test_the_probe_stays_within_its_budget_and_says_what_it_left_out():
    # 1000 steps of 10 ms: 10 s of training, 1 s of budget; each measurement costs 6 x 10 ms.
    probe = FakeProbe()
    plan, _ = resolved(probe, total_steps=1000)
    assert plan.probe.value <= 0.1 * 1000 * 0.01 + 1e-9
    assert "budget 1.00 s: 10% of the expected 10.0 s of training" in plan.probe.reason
    assert "not measured: about 30.1 s" in plan.compile.reason  # compile's assumed cost does not fit
    short = FakeProbe()
    tiny, _ = resolved(short, total_steps=150)  # 0.15 s of budget: the reference and a stage or two
    skipped = [name for name in ("precision", "tf32", "cudnn_benchmark", "optimizer_kernel", "step_graph")
               if "of the probe's budget is left" in getattr(tiny, name).reason]
    assert skipped and tiny.probe.value <= 0.15 + 1e-9


def test_a_short_trainings_budget_is_spread_over_every_stage(monkeypatch):
    # 500 steps of 10 ms: 0.5 s of budget. Two rounds of 50 ms blocks would spend it on threads and
    # precision; one round of blocks sized to the budget measures the optimizer kernel too.
    monkeypatch.setattr("gpufill.engine.plan.torch.get_num_threads", lambda: 2)
    cpu_bf16 = CPU.__class__(**{**{f: getattr(CPU, f) for f in CPU.__dataclass_fields__}, "bf16_supported": True})
    probe = FakeProbe({("threads", 1): 0.7, ("precision", "bf16"): 0.8, ("optimizer_kernel", "for-loop"): 0.9})
    plan, _ = resolved(probe, hardware=cpu_bf16, total_steps=500)
    assert (plan.threads.value, plan.precision.value, plan.optimizer_kernel.value) == (1, "bf16", "for-loop")
    assert "measured 1.11x fused optimizer" in plan.optimizer_kernel.reason
    assert len(probe.calls) == 7  # the reference, then each stage's two candidates once
    assert plan.probe.value <= 0.5 + 1e-9 and "budget 0.50 s" in plan.probe.reason


def test_short_trainings_and_unknown_lengths_are_not_probed():
    probe = FakeProbe()
    plan, _ = resolved(probe, total_steps=20)
    assert probe.calls == [] and plan.probe.value == 0.0 and "only 20 optimizer steps" in plan.probe.reason
    unknown, _ = resolved(probe, total_steps=None)
    assert probe.calls == [] and unknown.probe.reason.startswith("off:")
    off, _ = resolved(probe, settings=SpeedSettings(probe=False, batch_search=False))
    assert probe.calls == [] and "careful hand loop's value" in off.probe.reason


def test_a_cached_probe_measures_nothing_and_decides_the_same(tmp_path):
    first_probe = FakeProbe({("precision", "bf16"): 0.6, ("step_graph", True): 0.5})
    first, _ = resolved(first_probe, cache=TuneCache(tmp_path), key="shape")
    cache_module.clear_memory()  # a new process: read from the file
    again_probe = FakeProbe({("precision", "bf16"): 5.0})  # would decide otherwise if it measured
    again, _ = resolved(again_probe, cache=TuneCache(tmp_path), key="shape")
    assert again_probe.calls == [] and again.probe.value == 0.0 and "cached measurements" in again.probe.reason
    assert (again.precision.value, again.step_graph.value) == (first.precision.value, first.step_graph.value) == ("bf16", True)
    assert again.precision.reason.endswith("(cached measurement)")


def test_cpu_stages_time_threads_precision_and_the_optimizer_kernel(monkeypatch):
    monkeypatch.setattr("gpufill.engine.plan.torch.get_num_threads", lambda: 2)
    cpu_bf16 = CPU.__class__(**{**{f: getattr(CPU, f) for f in CPU.__dataclass_fields__}, "bf16_supported": True})
    probe = FakeProbe({("threads", 1): 0.7, ("precision", "bf16"): 0.8, ("optimizer_kernel", "for-loop"): 1.3})
    plan, _ = resolved(probe, hardware=cpu_bf16)
    assert plan.threads.value == 1 and "measured 1.43x 2 threads" in plan.threads.reason
    assert plan.precision.value == "bf16" and plan.optimizer_kernel.value == "fused"
    assert not plan.step_graph.value and "CUDA" in plan.step_graph.reason
    kinds = {name.split()[0] for name in probe.calls}
    assert kinds == {"threads=2", "threads=1"}


# -- the real probe on CPU trainings --------------------------------------------------------------


def generous(monkeypatch):
    """A budget that lets every stage run on a short test training (compile assumed free)."""
    monkeypatch.setattr(resolver_module, "PROBE_SHARE", 1000.0)
    monkeypatch.setattr(resolver_module, "PROBE_MAX_S", 1000.0)
    monkeypatch.setitem(resolver_module.COMPILE_GUESS_S, "cpu", 0.0)


def slowed(kernel: str, seconds: float):
    """build_kit, but the optimizer of `kernel` sleeps on every step."""
    real = probe_module.build_kit

    def build(model, plan, *args, **kwargs):
        kit = real(model, plan, *args, **kwargs)
        if plan.optimizer_kernel.value == kernel:
            step = kit.optimizer.step

            def slow(*a, **k):
                time.sleep(seconds)
                return step(*a, **k)

            kit.optimizer.step = slow  # type: ignore[method-assign]
        return kit

    return build


@pytest.mark.parametrize(("slow", "chosen"), [("fused", "for-loop"), ("for-loop", "fused")])
def test_an_injected_slow_candidate_loses_on_real_steps(monkeypatch, slow, chosen):
    generous(monkeypatch)
    monkeypatch.setattr(probe_module, "build_kit", slowed(slow, 0.004))
    x, y = regression(n=2048)
    result = fit(mlp(), (x, y), epochs=8, batch_size=16, compile=False, threads=1, precision="fp32")
    assert result.plan.optimizer_kernel.value == chosen, result.plan.optimizer_kernel.reason
    assert result.plan.probe.value > 0 and any(e.startswith("optimizer_kernel: ") for e in result.events)


def test_a_candidate_that_fails_on_real_steps_is_dropped_and_training_goes_on(monkeypatch):
    generous(monkeypatch)

    def broken_compile(module, **kwargs):
        def forward(*args):
            raise RuntimeError("inductor: unsupported op")
        return forward

    monkeypatch.setattr(torch, "compile", broken_compile)
    x, y = regression(n=2048)
    result = fit(mlp(), (x, y), epochs=8, batch_size=16, threads=1, precision="fp32")
    assert result.plan.compile.value is False
    assert "compile (default) dropped (RuntimeError: inductor: unsupported op)" in result.plan.compile.reason
    assert result.history[-1].train_loss < result.history[0].train_loss


def test_low_precision_beyond_tolerance_keeps_fp32_on_real_steps(monkeypatch):
    generous(monkeypatch)
    monkeypatch.setattr("gpufill.engine.measure.live.LOSS_TOLERANCE", 0.0)  # any bf16 rounding is "too much"
    cpu_bf16 = CPU.__class__(**{**{f: getattr(CPU, f) for f in CPU.__dataclass_fields__}, "bf16_supported": True, "cpu_count": 1})
    monkeypatch.setattr("gpufill.engine.prepare.detect", lambda device="auto": cpu_bf16)
    x, y = regression(n=2048)
    result = fit(mlp(hidden=64), (x, y), epochs=8, batch_size=16, compile=False, optimizer_kernel="fused", threads=1)
    # On a CPU the training's first steps measure precision (measure/live.py): bf16 is checked there and dropped.
    assert result.plan.precision.value == "fp32"
    assert "1 thread bf16 dropped: its loss differs by" in result.plan.precision.reason


def test_the_probe_leaves_the_training_bit_identical_to_one_without_it(monkeypatch):
    generous(monkeypatch)
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: module)  # compile "measured", and free
    x, y = regression(n=2048)
    torch.manual_seed(5)
    # threads and precision given: on a CPU the training's first steps would choose them (measure/live.py), not the probe.
    probed = fit(mlp(), (x, y), (x[:256], y[:256]), epochs=8, batch_size=16, seed=3, threads=1, precision="fp32")
    plan = probed.plan
    assert plan.probe.value > 0 and "measurements in" in plan.probe.reason
    torch.manual_seed(5)
    chosen = FitConfig(epochs=8, batch_size=16, seed=3, probe=False, threads=plan.threads.value, precision=plan.precision.value,
                       optimizer_kernel=plan.optimizer_kernel.value, compile=plan.compile.value or False)
    plain = fit(mlp(), (x, y), (x[:256], y[:256]), config=chosen)
    assert_same_weights(probed.model, plain.model, atol=0.0)
    assert [r.train_loss for r in probed.history] == [r.train_loss for r in plain.history]
