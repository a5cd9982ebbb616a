"""A tune cache file that is valid JSON of the wrong shape (issue 37, item 12) is treated as a damaged cache is today:
absent, measured again, and rewritten whole at the next measurement; never an AttributeError."""

from __future__ import annotations

import json

import pytest

from gpufill.engine.measure import cache as cache_module
from gpufill.engine.measure.cache import CACHE_FILE, TuneCache, TuneCacheWarning


@pytest.fixture(autouse=True)
def _fresh_memory():
    cache_module.clear_memory()
    yield
    cache_module.clear_memory()


@pytest.mark.parametrize("text", ["[]", "null", "7", '"text"', "[{\"k\": {\"a\": 1}}]", "[" * 100_000 + "]" * 100_000])
def test_a_cache_of_another_shape_is_absent_and_rewritten(tmp_path, text):
    (tmp_path / CACHE_FILE).write_text(text)
    cache = TuneCache(tmp_path)
    assert cache.get("k", dict) is None
    cache.put("k", {"a": 1})
    assert json.loads((tmp_path / CACHE_FILE).read_text()) == {"k": {"a": 1}}
    cache_module.clear_memory()
    assert TuneCache(tmp_path).get("k", dict) == {"a": 1}


@pytest.mark.parametrize("entry", [None, [], 3, "x"])
def test_an_entry_of_another_shape_is_measured_again(tmp_path, entry):
    (tmp_path / CACHE_FILE).write_text(json.dumps({"k": entry, "other": {"b": 2}}))
    cache = TuneCache(tmp_path)
    if entry is None:  # null: as absent, nothing to say
        assert cache.get("k", dict) is None
    else:
        with pytest.warns(TuneCacheWarning, match=f"the entry 'k' is damaged \\(TypeError: {type(entry).__name__} where an object belongs\\)"):
            assert cache.get("k", dict) is None
    assert cache.get("other", dict) == {"b": 2}
    cache.put("k", {"a": 1})
    assert json.loads((tmp_path / CACHE_FILE).read_text()) == {"k": {"a": 1}, "other": {"b": 2}}


def test_the_named_cache_of_the_environment_is_read_the_same_way(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFILL_TUNE_CACHE", str(tmp_path))
    (tmp_path / CACHE_FILE).write_text("null")
    assert TuneCache(None).get("k", dict) is None
