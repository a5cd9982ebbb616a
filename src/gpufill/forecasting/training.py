"""A forecaster's training settings: the engine's FitConfig and its defaults, as forecasting hands them on.

The campaign's schema (campaign/spec/spec.py, the `train:` section) takes its defaults and its FitConfig from here:
the campaign speaks to forecasting, and forecasting alone to the engine's training internals (issue 27's
direction: campaign = when and where, forecasting = what and how, engine = how fast).
"""

from __future__ import annotations

from gpufill.engine.config import DEFAULTS, REGRESSION_LOSSES, SCHEDULES, FitConfig, check_patience
from gpufill.engine.losses import outputs_per_target

__all__ = ["DEFAULTS", "FORECAST_EPOCHS", "FORECAST_PATIENCE", "REGRESSION_LOSSES", "SCHEDULES", "FitConfig", "check_patience",
           "outputs_per_target"]

FORECAST_EPOCHS = 100
"""A forecaster's epochs unless set: an upper bound that early stopping on validation ends, as practitioners train
them; fit's own 10 undertrains the recurrent families. `python bench/train_length.py` (24 M1 monthly series, local
mode, horizon 1, lookback 12, default recipes; bench/results/train_length-*.json), median test MAE over the seasonal
naive's, 10 -> 100 epochs with patience 5: lstm 0.86 -> 0.76, gru 0.93 -> 0.79, tcn 0.80 -> 0.73, transformer
0.77 -> 0.80; the campaign took 2.9x as long."""
FORECAST_PATIENCE = 5
"""Validations without improvement before a forecaster's training stops (campaigns and `gpufill train`)."""
