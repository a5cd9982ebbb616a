"""A project: one time-indexed series with a target and optional covariates, and the fingerprint of what made it.

A fingerprint names the data in trial ids, so it must be the same on every machine. Computed floats are not:
numpy and OpenBLAS pick their kernels by CPU feature (the synthetic generator's AR(1) noise goes through
``np.convolve``, i.e. BLAS ``ddot``, whose summation order differs between OpenBLAS's Haswell, Sandybridge and
Prescott kernels; ``np.exp`` has its own AVX-512 code), so the bytes of generated values differ in the last bit
from one CPU to the next. A loader therefore fingerprints what the values were made from: the generator's name,
version and arguments, or the cells as read from a file (parsing text or Parquet is exact arithmetic, the same
everywhere). Only a project built in code falls back to its values' bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Project:
    """One dataset, already loaded and cleaned (no NaN)."""

    name: str
    target: np.ndarray
    """(T,) float64."""
    covariates: np.ndarray
    """(T, C) float64; C may be 0."""
    covariate_names: tuple[str, ...]
    source: str
    """File path(s) or "synthetic"; named in error messages."""
    time: np.ndarray | None = None
    """(T,) timestamps, when the source had a time column."""
    origin: str = ""
    """The fingerprint the loader gave (`recipe_fingerprint`, `cells_fingerprint`): the same on every machine.
    Empty for a project built in code: its values are then hashed."""
    season: int | None = None
    """The season of its time index (`season_length_of`), found where the file was read, which has pandas loaded; a
    worker handed the project reads it here instead of importing pandas (about a second). None: found when asked."""

    @property
    def length(self) -> int:
        return int(self.target.shape[0])

    @property
    def width(self) -> int:
        """A network's input width on this project: the target and each covariate (windows.n_features)."""
        return 1 + int(self.covariates.shape[1]) if self.covariates.ndim == 2 else 1

    def season_length(self) -> int:
        """The season of the time index: the loader's (`season`), else found now."""
        return self.season if self.season is not None else season_length_of(self.time, self.source)

    def fingerprint(self) -> str:
        """What identifies the values a training sees: equal on every machine for the same data and settings,
        different after any edit of a value (a file) or of the generator's version or arguments (synthetic)."""
        return self.origin or cells_fingerprint(self.target, self.covariates, self.covariate_names)


def cells_fingerprint(target: np.ndarray, covariates: np.ndarray, names: tuple[str, ...] | list[str]) -> str:
    """A hash of values as they were read (target, covariates and their names, in time order): equal for an
    unchanged file however it was re-saved, different after any edit of a value. Never give it values a kernel
    computed (exp, sin, a BLAS sum): their last bits differ from one CPU to the next."""
    digest = hashlib.sha256()
    for array in (target, covariates):
        values = np.ascontiguousarray(array, dtype=np.float64)
        if np.isnan(values).any():  # one NaN, whatever payload the reader gave it (missing cells are filled later)
            values = np.where(np.isnan(values), np.nan, values)
        digest.update(str(values.shape).encode())
        digest.update(values.tobytes())
    digest.update("\x00".join(names).encode())
    return digest.hexdigest()[:16]


def recipe_fingerprint(generator: str, version: int, **arguments: Any) -> str:
    """A hash of how generated values are made (the generator, its version and its arguments), never of the
    values themselves; bump the generator's version whenever its output changes."""
    recipe = {"generator": generator, "version": int(version), "arguments": arguments}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def season_length_of(time: np.ndarray | None, source: str) -> int:
    """The season of a project's time index (1 when there is none or it is irregular): M4's
    conventions (daily 7, weekly 52, monthly 12, quarterly 4, hourly 24); synthetic data is daily."""
    if source == "synthetic":
        return 7  # gpufill's synthetic projects are daily, with a weekly cycle
    if time is None or len(time) < 3:
        return 1
    import pandas as pd

    frequency = pd.infer_freq(pd.DatetimeIndex(time))
    if frequency is None:
        return 1
    return SEASONS.get(frequency.split("-")[0].lstrip("0123456789"), 1)


SEASONS = {"D": 7, "B": 5, "W": 52, "MS": 12, "ME": 12, "M": 12, "QS": 4, "QE": 4, "Q": 4, "h": 24, "H": 24, "YS": 1, "YE": 1, "Y": 1, "A": 1}
"""A pandas frequency's code -> its season length."""
