"""A probe that keeps its word: a measurement running far past its estimate (a compile slower than assumed, a step
stalled by other work) is abandoned at the deadline, and the probe as a whole never runs past 1.5x its stated budget."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from gpufill.engine.config import SpeedSettings
from gpufill.engine.measure import resolver as resolver_module
from gpufill.engine.measure.deadline import Abandoned, deadline
from gpufill.engine.measure.resolver import CHECK_STEPS, Measurement, TuneCache, label, resolve
from gpufill.engine.plan import DataFacts, make_plan
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

    def measure(self, plan, *, timed_steps, check):
        self.calls.append(label(plan))
        values = {(name, getattr(plan, name).value) for name in ("threads", "precision", "optimizer_kernel", "compile")}
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
