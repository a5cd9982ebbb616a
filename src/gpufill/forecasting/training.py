"""A forecaster's training settings: the engine's FitConfig and its defaults, as forecasting hands them on.

The campaign's schema (campaign/spec.py, the `train:` section) takes its defaults and its FitConfig from here:
the campaign speaks to forecasting, and forecasting alone to the engine's training internals (issue 27's
direction: campaign = when and where, forecasting = what and how, engine = how fast).
"""

from __future__ import annotations

from gpufill.engine.config import DEFAULTS, FitConfig

__all__ = ["DEFAULTS", "FitConfig"]
