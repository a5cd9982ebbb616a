"""fit talks and stops when told: one line per epoch (losses, samples/s, ETA) when stderr is a
terminal, `max_steps`, and an endless stream with nothing to bound it refused in one line."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from torch.utils.data import IterableDataset

from gpufill.engine.loop import fit
from gpufill.engine.progress import duration, epoch_line, epochs_left, wants_lines
from gpufill.engine.result import EpochRecord
from gpufill.engine.streams import endless_loop_at
from tests.engine.common import assert_same_weights, input_error, linear, regression

QUIET = {"probe": False, "batch_search": False, "compile": False, "device": "cpu"}


def test_one_line_per_epoch_with_the_epochs_own_losses_and_nothing_per_step(capsys):
    x, y = regression(256)
    result = fit(linear(), (x, y), (x[:64], y[:64]), epochs=3, batch_size=32, verbose=True, **QUIET)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3  # 8 steps an epoch, 3 epochs: three lines, none per step
    for line, record in zip(lines, result.history, strict=True):
        assert line.startswith(f"epoch {record.epoch}/3  train loss {record.train_loss:.4g}  val loss {record.val_loss:.4g}  ")
        assert "samples/s" in line and record.samples == 256 and record.steps == 8
    assert "ETA" in lines[0] and "ETA" in lines[1] and "ETA" not in lines[2]  # nothing left after the last
    fit(linear(), (x, y), epochs=2, batch_size=32, verbose=False, **QUIET)
    assert capsys.readouterr().err == ""


def test_auto_prints_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wants_lines("auto", Terminal()) and not wants_lines("auto", io.StringIO())
    assert wants_lines(True, io.StringIO()) and not wants_lines(False, Terminal())


def test_the_line_and_its_eta():
    record = EpochRecord(epoch=2, train_loss=0.5, val_loss=None, seconds=2.0, lr=1e-3, samples=1000, steps=10)
    assert epoch_line(record, 10, 2.0, epochs_left(record, 10, None, 20)) == "epoch 2/10  train loss 0.5  500 samples/s  2 s  ETA 16 s"
    assert epochs_left(record, 10, 25, 20) == pytest.approx(0.5)  # max_steps ends it in half an epoch
    assert (duration(16), duration(125), duration(7300)) == ("16 s", "2 min 05 s", "2 h 01 min")


def test_max_steps_cuts_the_last_epoch_and_the_schedule_ends_with_it():
    x, y = regression(256)
    result = fit(linear(), (x, y), epochs=5, batch_size=32, max_steps=12, schedule="linear", warmup_steps=0, lr=0.1, **QUIET)
    assert [r.steps for r in result.history] == [8, 4] and result.metrics["epochs_run"] == 2
    assert result.events[-1] == "stopped at max_steps 12 in epoch 2 (4 of its steps)"
    assert result.history[-1].lr == pytest.approx(0.0, abs=1e-9)  # the linear decay spans the 12 steps, not 5 epochs'


def test_max_steps_on_an_epoch_boundary_trains_what_those_epochs_train():
    x, y = regression(256)
    by_steps = fit(linear(), (x, y), epochs=5, batch_size=32, max_steps=16, **QUIET)
    by_epochs = fit(linear(), (x, y), epochs=2, batch_size=32, **QUIET)
    assert_same_weights(by_steps.model, by_epochs.model, atol=1e-7)
    assert [r.train_loss for r in by_steps.history] == pytest.approx([r.train_loss for r in by_epochs.history], rel=1e-6)


def test_a_resumed_training_that_reached_max_steps_takes_no_more(tmp_path):
    x, y = regression(256)
    first = fit(linear(), (x, y), epochs=5, batch_size=32, max_steps=12, checkpoint_dir=tmp_path, **QUIET)
    again = fit(linear(), (x, y), epochs=5, batch_size=32, max_steps=12, checkpoint_dir=tmp_path, resume=True, **QUIET)
    assert [r.steps for r in again.history] == [8, 4]
    assert_same_weights(first.model, again.model, atol=0)


class Endless(IterableDataset):
    def __init__(self):
        self.x, self.y = regression(64)

    def __iter__(self):
        while True:
            index = int(torch.randint(0, 64, ()))
            yield self.x[index], self.y[index]


class Cycled(IterableDataset):
    def __iter__(self):
        x, y = regression(16)
        for i in itertools.cycle(range(16)):
            yield x[i], y[i]


class Finite(IterableDataset):
    """Ends by a break inside `while True`: one pass."""

    def __iter__(self):
        x, y = regression(96)
        i = 0
        while True:
            if i == 96:
                break
            yield x[i], y[i]
            i += 1


def test_an_endless_stream_with_nothing_to_bound_it_is_refused_in_one_line():
    error = input_error(fit, linear(), Endless(), field="train", contains=("Endless.__iter__ loops forever", "test_progress.py:"), epochs=2, **QUIET)
    assert "steps_per_epoch=N" in error.fix and "max_steps=N" in error.fix
    input_error(fit, linear(), Cycled(), field="train", contains=("Cycled.__iter__ loops forever",), **QUIET)
    bounded = fit(linear(), Endless(), epochs=3, batch_size=16, max_steps=5, **QUIET)
    assert [r.steps for r in bounded.history] == [5] and bounded.history[0].samples == 80  # one epoch of max_steps
    per_epoch = fit(linear(), Endless(), epochs=2, batch_size=16, steps_per_epoch=3, **QUIET)
    assert [r.steps for r in per_epoch.history] == [3, 3]


def test_a_stream_whose_loop_ends_trains_one_pass_per_epoch():
    assert endless_loop_at(Finite()) is None and endless_loop_at(Endless()) is not None
    result = fit(linear(), Finite(), epochs=2, batch_size=16, **QUIET)
    assert [r.samples for r in result.history] == [96, 96] and [r.steps for r in result.history] == [6, 6]


class SlicedForever(IterableDataset):
    """Ends: `__iter__` slices an endless generator it defines inside."""

    def __iter__(self):
        x, y = regression(32)

        def forever():
            while True:
                yield from zip(x, y)

        return itertools.islice(forever(), 32)


def test_an_endless_loop_inside_a_nested_function_is_not_the_streams_own():
    assert endless_loop_at(SlicedForever()) is None
    result = fit(linear(), SlicedForever(), epochs=1, batch_size=8, **QUIET)
    assert [r.samples for r in result.history] == [32]


def test_an_endless_stream_in_a_given_dataloader_or_as_validation_is_refused():
    from torch.utils.data import DataLoader

    loader = DataLoader(Endless(), batch_size=8)
    error = input_error(fit, linear(), loader, field="train", contains=("loops forever",), steps_per_epoch=3, **QUIET)
    assert "max_steps=N" in error.fix and "steps_per_epoch" in error.fix  # a given loader's pass is not cut by steps_per_epoch
    bounded = fit(linear(), loader, epochs=1, max_steps=4, **QUIET)
    assert [r.steps for r in bounded.history] == [4]
    x, y = regression(64)
    input_error(fit, linear(), (x, y), Endless(), field="val", contains=("validation, which reads its data to the end",), max_steps=4, **QUIET)
