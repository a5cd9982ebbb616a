"""A probe that keeps its word: a measurement running far past its estimate (a compile slower than assumed, a step
stalled by other work) is abandoned at the deadline, and the probe as a whole never runs past 1.5x its stated budget."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from gpufill.engine.batches import ResidentBatches
from gpufill.engine.config import FitConfig, SpeedSettings
from gpufill.engine.losses import resolve as resolve_loss
from gpufill.engine.measure import resolver as resolver_module
from gpufill.engine.loop import fit
from gpufill.engine.measure.cache import clear_memory
from gpufill.engine.measure.deadline import Abandoned, deadline
from gpufill.engine.measure.probe import FitProbe
from gpufill.engine.measure.resolver import CHECK_STEPS, Measurement, TuneCache, label, resolve
from gpufill.engine.plan import DataFacts, make_plan
from gpufill.engine.snapshot import preserved_weights
from tests.engine.common import assert_same_weights, mlp, regression
from tests.engine.test_measured_plan import RESIDENT
from tests.fakes import CPU


def test_a_deadline_stops_a_sleep_and_leaves_the_timer_and_handler_as_they_were():
    started = time.monotonic()
    with pytest.raises(Abandoned), deadline(0.2) as armed:
        assert armed
        time.sleep(30)
    assert 0.15 < time.monotonic() - started < 10  # 10: a loaded box's signal delivery, far below the sleep
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with deadline(5.0) as armed:  # a block that ends in time: nothing raised afterwards
        assert armed
    time.sleep(0.05)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with deadline(None) as armed:
        assert not armed


def test_outside_the_main_thread_or_beside_another_timer_nothing_is_armed():
    seen: list[bool] = []

    def worker() -> None:
        with deadline(0.01) as armed:
            seen.append(armed)
            time.sleep(0.1)  # would raise if armed

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [False]
    previous = signal.signal(signal.SIGALRM, lambda *_: None)  # someone else's handler
    try:
        with deadline(0.01) as armed:
            assert not armed
    finally:
        signal.signal(signal.SIGALRM, previous)


class SleepingProbe:
    """Steps of 2 ms on the real clock; the candidates in `sleeps` stall for a minute (a compile far slower than its
    guess, a step stuck behind other work)."""

    def __init__(self, sleeps: set[tuple[str, object]]):
        self.sleeps, self.calls, self.released = sleeps, [], 0

    def measure(self, plan, *, timed_steps, check, limit=None):
        self.calls.append(label(plan))
        values = {(name, getattr(plan, name).value) for name in ("threads", "precision", "optimizer_kernel", "compile")}
        with deadline(limit):  # as the real probes arm it
            if values & self.sleeps:
                time.sleep(60)
            time.sleep(((CHECK_STEPS if check else 1) + timed_steps) * 0.002)
        return Measurement(0.002, (1.0,) * CHECK_STEPS if check else ())

    def release(self) -> None:
        self.released += 1


@pytest.mark.parametrize("stalled", [("compile", "default"), ("threads", 1)])
def test_a_stalled_candidate_is_abandoned_and_the_probe_ends_within_one_and_a_half_budgets(monkeypatch, stalled):
    monkeypatch.setattr("gpufill.engine.plan.torch.get_num_threads", lambda: 2)
    monkeypatch.setitem(resolver_module.COMPILE_GUESS_S, "cpu", 0.0)  # a guess that turns out far too low
    settings = SpeedSettings(batch_search=False, compile="auto") if stalled[0] == "compile" else SpeedSettings(batch_search=False)
    facts = DataFacts(n_train=100_000, bytes_total=1)
    plan = make_plan(CPU, facts, settings, epochs=1)
    probe = SleepingProbe({stalled})
    events: list[str] = []
    started = time.perf_counter()
    # 10,000 steps of 2 ms: 20 s of training, a budget of 2 s.
    finished = resolve(plan, probe, settings=settings, hardware=CPU, facts=facts, context=RESIDENT, total_steps=10_000,
                       cache=TuneCache(None), key=f"deadline-{stalled}", events=events)
    took = time.perf_counter() - started
    assert "budget 2.00 s" in finished.probe.reason
    assert took < 1.5 * 2.0 + 0.5  # + the slack of a loaded box's timer: a minute's sleep never reached
    reason = getattr(finished, stalled[0]).reason
    assert "dropped (abandoned after" in reason and "past 1.25x the probe's budget of 2.0 s" in reason
    assert getattr(finished, stalled[0]).value != stalled[1] and probe.released >= 1


class _StepRaises(torch.optim.SGD):
    """An optimizer whose step raises `error` once the backward has filled the gradients: where a deadline's alarm
    (or a candidate's failure) can cut a measurement off."""

    def __init__(self, params, error: BaseException):
        super().__init__(params, lr=0.1)
        self.error = error

    def step(self, closure=None):
        raise self.error


@pytest.mark.parametrize("error", [Abandoned("past its deadline of 0.0 s"), RuntimeError("a candidate that fails mid-step")])
def test_a_measurement_cut_off_after_its_backward_leaves_no_gradient_weight_or_random_state_behind(error):
    """The training's first backward accumulates into whatever gradient the probe left: a measurement cut off between
    its backward and its zero_grad used to leave one, and the training then differed (a forecast trained again was 0.5
    off the campaign's own)."""
    cpu = torch.device("cpu")
    x, y = regression(n=256)
    model = mlp(seed=3)
    cfg = FitConfig(batch_size=64, lr=1e-2, probe=False, optimizer=lambda params: _StepRaises(params, error))
    plan = make_plan(CPU, DataFacts(n_train=256, bytes_total=1), cfg, epochs=1)
    probe = FitProbe(model, cfg, resolve_loss("mse")[0], ResidentBatches((x, y), cpu), cpu)
    weights, rng = {name: value.clone() for name, value in model.state_dict().items()}, torch.get_rng_state()
    if isinstance(error, Abandoned):
        with pytest.raises(Abandoned):
            probe.measure(plan, timed_steps=3, check=True)
    else:
        measured = probe.measure(plan, timed_steps=3, check=True)
        assert measured.step_s is None and measured.error == "RuntimeError: a candidate that fails mid-step"
    assert [p.grad for p in model.parameters()] == [None] * 4
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_gradients_the_training_had_before_a_measurement_are_put_back_in_the_same_tensors():
    model = mlp(seed=3)
    model(torch.ones(2, 4)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    values = [g.clone() for g in grads]
    with preserved_weights(model, torch.device("cpu")):
        model(torch.full((2, 4), 3.0)).sum().backward()  # accumulates into the same tensors
    assert all(p.grad is g for p, g in zip(model.parameters(), grads)) and all(torch.equal(g, v) for g, v in zip(grads, values))


def _fit_with_one_candidate_cut_off(monkeypatch, tmp_path, after_backward: bool):
    """A fit whose probe's for-loop optimizer candidate is abandoned at its first step: before anything ran, or
    after its backward (where the deadline's alarm may land)."""
    real_run = FitProbe._run

    def run(self, plan, timed_steps, check, started):
        if plan.optimizer_kernel.value != "for-loop":
            return real_run(self, plan, timed_steps, check, started)
        if after_backward:
            (x, y), _ = next(iter(self.batches.in_order(64)))
            torch.nn.functional.mse_loss(self.model(x), y).backward()
        raise Abandoned("past its deadline of 0.0 s")

    monkeypatch.setattr(FitProbe, "_run", run)
    # The probe's budget is 10 % of the expected training (~0.07 s here): on a busy box the candidates before the
    # for-loop optimizer spent it, which was then never tried (CI, 2026-11-30). This test is about the cut-off, not the
    # budget: one the box cannot spend first (capped at PROBE_MAX_S).
    monkeypatch.setattr(resolver_module, "PROBE_SHARE", 100.0)
    clear_memory()
    x, y = regression(n=4096)
    torch.manual_seed(0)
    return fit(mlp(), (x, y), (x[:256], y[:256]), epochs=12, batch_size=32, seed=1, precision="fp32", threads=1, compile=False,
               tune_cache=str(tmp_path / str(after_backward)), verbose=False)


def test_a_fit_whose_probe_was_cut_off_after_a_backward_trains_exactly_as_one_cut_off_before(monkeypatch, tmp_path):
    before = _fit_with_one_candidate_cut_off(monkeypatch, tmp_path, after_backward=False)
    after = _fit_with_one_candidate_cut_off(monkeypatch, tmp_path, after_backward=True)
    assert "for-loop optimizer dropped (abandoned after" in after.plan.optimizer_kernel.reason, after.plan.optimizer_kernel.reason
    assert after.plan.optimizer_kernel.value == before.plan.optimizer_kernel.value
    assert_same_weights(after.model, before.model, atol=0.0)
    assert [r.train_loss for r in after.history] == [r.train_loss for r in before.history]
