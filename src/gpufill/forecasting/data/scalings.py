"""The per-window scalings by name: the one list the campaign file, `gpufill train` and the windows read.

Only names here (no torch), so the campaign's spec checks a value without importing what scales windows
(forecasting/data/window_scaling.py does the scaling and says what each one means).
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["ORIGIN_KEEPING", "SCALINGS", "ScalingName"]

ScalingName = Literal["project", "last", "mean", "standard", "raw"]
SCALINGS: tuple[str, ...] = get_args(ScalingName)

ORIGIN_KEEPING: tuple[str, ...] = ("mean", "raw")
"""The scalings whose zero is the series' zero: a percentage loss (sMAPE, MAPE) on their values is that loss of the forecast."""
