"""Measured choices cached per (model shape, device): a campaign measures once per shape.

A JSON file in the workdir (written atomically; concurrent workers at worst measure the
same shape twice) plus an in-process dict, so a worker that trains many trials of one
shape measures once even without a workdir.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from gpufill.errors import InputError
from gpufill.files import open_existing, write_atomically

CACHE_FILE = "tune-cache.json"
ENVIRONMENT = "GPUFILL_TUNE_CACHE"
"""A directory a user names once (e.g. in their shell profile) so that every `fit` on this machine shares one cache:
the second run of a shape trains at once on the first run's measurements. Unset, nothing is written anywhere but
the paths a call names (a campaign's workdir)."""
_MEMORY: dict[str, dict[str, Any]] = {}
_WARNED: set[str] = set()
T = TypeVar("T")


class TuneCacheWarning(UserWarning):
    """An entry of the tune cache could not be read as what it should hold: it is measured again."""


def shape_key(kind: str, model: nn.Module, sample_signature: str, device_name: str, **settings: Any) -> str:
    """What makes two measurements interchangeable: model class and parameter shapes, the batch's
    structure and per-sample shapes (`batches.signature`), device, settings."""
    params = ";".join(f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters())
    digest = hashlib.sha1(f"{type(model).__qualname__}|{params}".encode()).hexdigest()[:12]
    batch = hashlib.sha1(sample_signature.encode()).hexdigest()[:8]
    extra = ",".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return f"{kind}|{device_name}|{type(model).__name__}-{digest}|batch-{batch}|{extra}"


class TuneCache:
    """get/put of JSON-ready dicts by key; `directory=None`: the one `GPUFILL_TUNE_CACHE` names, else this process only."""

    def __init__(self, directory: str | Path | None):
        directory = directory if directory is not None else os.environ.get(ENVIRONMENT) or None
        self.path = Path(directory) / CACHE_FILE if directory is not None else None

    def get(self, key: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
        """The entry for `key` as `parse` reads it (it raises on what it cannot use); None when absent or damaged (a
        hand-edited file, another version's entry, NaN where a time belongs): then it is measured again, said once."""
        value = _MEMORY.get(key)
        if value is None:
            value = self._read().get(key)
        if value is None:
            return None
        try:
            if not isinstance(value, dict):
                raise TypeError(f"{type(value).__name__} where an object belongs")
            parsed = parse(value)
        except (KeyError, TypeError, ValueError, AttributeError) as error:  # pydantic's ValidationError is a ValueError
            _MEMORY.pop(key, None)
            if key not in _WARNED:
                _WARNED.add(key)
                where = self.path or "this process's tune cache"
                detail = " ".join(str(error).split())[:200]
                warnings.warn(f"tune cache {where}: the entry {key!r} is damaged ({type(error).__name__}: {detail}); it is measured again "
                              "and rewritten", TuneCacheWarning, stacklevel=2)
            return None
        _MEMORY[key] = value
        return parsed

    def put(self, key: str, value: dict[str, Any]) -> None:
        _MEMORY[key] = value
        if self.path is None:
            return
        entries = self._read()  # merge: another worker may have written other shapes meanwhile
        entries[key] = value
        try:  # a new temporary file per write (workers never share one), never through a link
            write_atomically(self.path, json.dumps(entries, indent=1, sort_keys=True), field="tune_cache")
        except InputError:
            pass  # a cache is only a shortcut: one that cannot be written (a full disk, a link there) is kept in memory

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            descriptor = open_existing(self.path, field="tune_cache")  # a link is not read
            if descriptor is None:
                return {}
            with os.fdopen(descriptor) as handle:
                entries = json.loads(handle.read())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, InputError, RecursionError):
            return {}  # a cache is only a shortcut: a damaged one is measured again
        return entries if isinstance(entries, dict) else {}  # `[]`, `null`, a number: valid JSON, damaged all the same


def clear_memory() -> None:
    """Forget in-process entries (tests)."""
    _MEMORY.clear()
    _WARNED.clear()


ENTRY_CONFIG = {"allow_inf_nan": False, "extra": "forbid"}
"""pydantic's config (a plain dict: nothing imported) for the dataclasses a cache entry holds, as their
`__pydantic_config__`: no NaN or infinity where a time belongs, no field this version does not know."""


def validated(kind: Any, value: Any) -> Any:
    """`value` checked and converted to `kind` (a dataclass with `__pydantic_config__ = ENTRY_CONFIG`, or a type such as
    dict[str, Measurement]) by pydantic: the parse a cache entry goes through. Raises ValueError on what does not fit."""
    from pydantic import TypeAdapter

    return TypeAdapter(kind).validate_python(value)
