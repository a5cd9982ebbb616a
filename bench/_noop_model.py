"""A classical model that does nothing: trials whose own work is ~0, for measuring executor overhead.

Used as ``_noop_model:noop`` in a campaign (bench/ on the workers' path); it predicts zeros.
"""

from __future__ import annotations

import numpy as np


class _Noop:
    def __init__(self, horizon: int):
        self.horizon = horizon

    def fit(self, x: np.ndarray, y: np.ndarray, *, threads: int, seed: int) -> None:
        return None

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.zeros((x.shape[0], self.horizon))


def noop(n_features: int, lookback: int, horizon: int) -> _Noop:
    return _Noop(horizon)


noop.gpufill_kind = "classical"  # type: ignore[attr-defined]
