"""A project: one time-indexed series with a target and optional covariates."""

from __future__ import annotations

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
