"""A damaged tune-cache entry is absent (measured again and rewritten), said once, never a crash: the forms a hand edit,
another version or a half-written value leave (bd3c8d8: `{}` KeyError 'measured', `"measured": []` AttributeError, text
or NaN `step_s` TypeError/ValueError, in every fit of that shape)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from gpufill.engine.loop import fit
from gpufill.engine.measure import cache as cache_module
from gpufill.engine.measure.cache import CACHE_FILE, TuneCache, TuneCacheWarning, validated
from gpufill.engine.measure.live import _cached_winner
from gpufill.engine.measure.resolver import Measurement
from gpufill.engine.packs.variants_measure import _timing
from tests.engine.test_fit import make_data, model


@pytest.fixture(autouse=True)
def _fresh_memory():
    cache_module.clear_memory()
    yield
    cache_module.clear_memory()


def measured(entry):
    return validated(dict[str, Measurement], entry["measured"])


GOOD_TIMING = {"k": 4, "pack_step_s": 0.01, "alone_step_s": 0.004, "pack_once_s": 0.1, "alone_once_s": 0.05, "threads": 2, "pairs": 3}

DAMAGED = [
    (measured, {}),
    (measured, {"measured": []}),
    (measured, {"measured": {"plain": {"step_s": "fast"}}}),
    (measured, {"measured": {"plain": {"step_s": math.nan}}}),
    (measured, {"measured": {"plain": {"step_s": 0.01, "losses": ["x"]}}}),
    (measured, {"measured": {"plain": {"step_s": 0.01, "surprise": 1}}}),
    (_cached_winner, {"winner": 7}),
    (_cached_winner, {"winner": "9999/fp32"}),
    (_cached_winner, {"winner": "2/fp64"}),
    (_timing, {**GOOD_TIMING, "pack_step_s": math.inf}),
    (_timing, {**GOOD_TIMING, "threads": 0}),
    (_timing, {k: v for k, v in GOOD_TIMING.items() if k != "k"}),
]


@pytest.mark.parametrize(("parse", "entry"), DAMAGED)
def test_a_damaged_entry_is_absent_with_one_warning(tmp_path, parse, entry):
    (tmp_path / CACHE_FILE).write_text(json.dumps({"shape": entry, "other": {"measured": {}}}))
    cache = TuneCache(tmp_path)
    with pytest.warns(TuneCacheWarning, match=f"tune cache {tmp_path / CACHE_FILE}: the entry 'shape' is damaged"):
        assert cache.get("shape", parse) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per entry, not at every fit of the shape
        assert cache.get("shape", parse) is None
    assert cache.get("other", measured) == {}  # the rest of the file is still read


def test_good_entries_read_back_as_what_was_measured(tmp_path):
    cache = TuneCache(tmp_path)
    cache.put("m", {"measured": {"plain": {"step_s": 0.01, "losses": [1.0, 0.9], "setup_s": 0.2, "cost_s": 0.5, "error": None, "peak_bytes": None}}})
    cache.put("w", {"winner": "1/fp32", "log": "1 thread fp32 kept"})
    cache.put("t", GOOD_TIMING)
    cache_module.clear_memory()
    again = TuneCache(tmp_path)
    assert again.get("m", measured) == {"plain": Measurement(step_s=0.01, losses=(1.0, 0.9), setup_s=0.2, cost_s=0.5)}
    winner, log = again.get("w", _cached_winner)
    assert (winner.threads, winner.precision, log) == (1, "fp32", "1 thread fp32 kept")
    assert again.get("t", _timing).k == 4


@pytest.mark.slow  # two fits with their probes
def test_a_fit_whose_cache_entries_are_all_damaged_measures_again_and_rewrites_them(tmp_path):
    x, y = make_data(n=2048)
    fit(model(), (x, y), epochs=2, batch_size=16, tune_cache=str(tmp_path))  # 256 steps: long enough to measure
    path = tmp_path / CACHE_FILE
    entries = json.loads(path.read_text())
    assert entries  # the probe's measurements (and the live trial's winner) were cached
    path.write_text(json.dumps({key: {"measured": {"plain": {"step_s": "NaN?"}}, "winner": 3} for key in entries}))
    cache_module.clear_memory()  # as the next process starts
    with pytest.warns(TuneCacheWarning, match="is damaged"):
        again = fit(model(), (x, y), epochs=2, batch_size=16, tune_cache=str(tmp_path))
    assert len(again.history) == 2 and all(math.isfinite(r.train_loss) for r in again.history)
    assert "cached" not in again.plan.precision.reason  # measured again, not read from the damaged entry
    rewritten = json.loads(path.read_text())
    assert set(rewritten) == set(entries)
    cache_module.clear_memory()
    assert all(TuneCache(tmp_path).get(key, measured) is not None for key, entry in rewritten.items() if "measured" in entry)
