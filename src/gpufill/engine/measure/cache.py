"""Measured choices cached per (model shape, device): a campaign measures once per shape.

A JSON file in the workdir (written atomically; concurrent workers at worst measure the
same shape twice) plus an in-process dict, so a worker that trains many trials of one
shape measures once even without a workdir.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from gpufill.errors import InputError
from gpufill.files import open_existing, write_atomically

CACHE_FILE = "tune-cache.json"
ENVIRONMENT = "GPUFILL_TUNE_CACHE"
"""A directory a user names once (e.g. in their shell profile) so that every `fit` on this machine shares one cache:
the second run of a shape trains at once on the first run's measurements. Unset, nothing is written anywhere but
the paths a call names (a campaign's workdir)."""
_MEMORY: dict[str, dict[str, Any]] = {}


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

    def get(self, key: str) -> dict[str, Any] | None:
        if key in _MEMORY:
            return _MEMORY[key]
        value = self._read().get(key)
        if not isinstance(value, dict):
            return None  # absent, or an entry of another shape: measured again, like a damaged file
        _MEMORY[key] = value
        return value

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
