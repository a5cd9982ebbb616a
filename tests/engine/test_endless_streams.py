"""Endless streams that reading `__iter__` cannot see (issue 37 item 9) are caught while they train: an unbounded
pass that runs past LONG_PASS_STEPS steps or LONG_PASS_S seconds says so in one line, with how to bound it, and again
at each doubling (a finite pass that long hears it too: it cannot be told from an endless one, and it goes on); a
bounded pass (max_steps, steps_per_epoch) never does."""

from __future__ import annotations

import itertools
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from gpufill.engine import step
from gpufill.engine.loop import fit
from gpufill.engine.streams import endless_loop_at
from tests.engine.common import linear, regression

QUIET = {"probe": False, "batch_search": False, "compile": False, "device": "cpu", "verbose": False}


class ReturnsCycle(IterableDataset):
    """`__iter__` returns an endless iterator instead of looping itself."""

    def __init__(self):
        self.x, self.y = regression(32)

    def __iter__(self):
        return itertools.cycle(list(zip(self.x, self.y, strict=True)))


class WhileNotFalse(IterableDataset):
    """A loop whose test is not the constant True the source check looks for."""

    def __init__(self):
        self.x, self.y = regression(32)

    def __iter__(self):
        i = 0
        while not False:
            yield self.x[i % 32], self.y[i % 32]
            i += 1


class YieldsFromForever(IterableDataset):
    """The endless loop lives in a helper that `__iter__` delegates to."""

    def __init__(self):
        self.x, self.y = regression(32)

    def _forever(self):
        while True:
            yield from zip(self.x, self.y, strict=True)

    def __iter__(self):
        yield from self._forever()


class Finite(IterableDataset):
    def __init__(self, n: int = 64):
        self.x, self.y = regression(n)

    def __iter__(self):
        yield from zip(self.x, self.y, strict=True)


@pytest.fixture
def short_bound(monkeypatch):
    monkeypatch.setattr(step, "LONG_PASS_STEPS", 12)
    monkeypatch.setattr(step, "LONG_PASS_S", 1e9)


@pytest.mark.parametrize("stream", [ReturnsCycle, WhileNotFalse, YieldsFromForever])
def test_an_endless_stream_the_source_check_misses_says_so_in_one_line_while_it_trains(stream, short_bound):
    assert endless_loop_at(stream()) is None  # the check before training cannot see it: only the guard can
    with warnings.catch_warnings():
        warnings.simplefilter("error", step.EndlessStreamWarning)  # the first warning ends this endless training
        with pytest.raises(step.EndlessStreamWarning) as caught:
            fit(linear(), stream(), epochs=2, batch_size=8, **QUIET)
    message = str(caught.value)
    assert "\n" not in message
    assert f"one epoch of {stream.__name__} has run 12 steps" in message
    assert "steps_per_epoch=N" in message and "max_steps=N" in message


def test_an_endless_stream_in_a_given_dataloader_is_caught_too(short_bound):
    loader = DataLoader(ReturnsCycle(), batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", step.EndlessStreamWarning)
        with pytest.raises(step.EndlessStreamWarning, match="one epoch of ReturnsCycle has run 12 steps"):
            fit(linear(), loader, epochs=2, batch_size=8, **QUIET)


def test_bounded_passes_and_finite_streams_are_never_warned(short_bound):
    with warnings.catch_warnings():
        warnings.simplefilter("error", step.EndlessStreamWarning)
        by_steps = fit(linear(), ReturnsCycle(), epochs=2, batch_size=8, max_steps=30, **QUIET)
        per_epoch = fit(linear(), WhileNotFalse(), epochs=2, batch_size=8, steps_per_epoch=20, **QUIET)
        finite = fit(linear(), Finite(80), epochs=2, batch_size=8, **QUIET)  # 10 steps a pass, within the bound
    assert sum(r.steps for r in by_steps.history) == 30
    assert [r.steps for r in per_epoch.history] == [20, 20]
    assert [r.steps for r in finite.history] == [10, 10]


class _Endless:
    """Batches of unknown length that never end, for the guard alone."""

    n = None

    def epoch(self, batch, generator):
        while True:
            yield SimpleNamespace(size=batch)


def test_the_time_bound_warns_before_the_step_bound_on_a_fake_clock_and_again_at_each_doubling():
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # every read one second later
        return now[0]

    steps_seen = []

    class Enough(Exception):
        """Ends the test's endless pass."""

    def a_step(batch):
        steps_seen.append(1)
        if len(steps_seen) == 2000:
            raise Enough

    class Totals:
        samples = 0

        def reset(self) -> None:
            self.samples = 0

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Enough):
            step.train_epoch(a_step, _Endless(), 8, torch.Generator(), Totals(), timing=step.EpochTiming(), clock=clock)
    messages = [str(w.message) for w in caught if issubclass(w.category, step.EndlessStreamWarning)]
    # 2000 steps at 3 clock reads (seconds) a step: the time bound (60 s, step 20: an answer within the first minute)
    # first, long before the step bound (100,000), then at each doubling of the time: 120, 240, ... 3840 s.
    steps = [int(m.split(" has run ")[1].split(" steps")[0]) for m in messages]
    seconds = [int(m.split(" steps in ")[1].split(" s")[0]) for m in messages]
    assert steps == [20, 40, 80, 160, 320, 640, 1280] and seconds == [60, 120, 240, 480, 960, 1920, 3840]
