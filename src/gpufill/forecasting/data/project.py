"""A project: one time-indexed series with a target and optional covariates."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

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

    @property
    def length(self) -> int:
        return int(self.target.shape[0])

    def fingerprint(self) -> str:
        """A hash of the values a training sees (target, covariates and their names, in time order):
        equal for an unchanged file however it was re-saved, different after any edit of a value."""
        digest = hashlib.sha256()
        for array in (self.target, self.covariates):
            values = np.ascontiguousarray(array, dtype=np.float64)
            digest.update(str(values.shape).encode())
            digest.update(values.tobytes())
        digest.update("\x00".join(self.covariate_names).encode())
        return digest.hexdigest()[:16]
