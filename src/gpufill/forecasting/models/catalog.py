"""The built-in model families as data: what a campaign needs to know of each (its kind, parameters and defaults,
whether it fits the series itself, whether its forecasts draw random numbers) without importing it, so a process
that only reads a campaign file (the scheduler, `gpufill check`, `status`) never imports torch.

Written by `python tools/family_catalog.py` from the built-in families (models/builtin.py); do not edit by hand
(tests/forecasting/test_family_catalog.py holds it equal to them).
"""

from __future__ import annotations

from typing import Any

BUILT_IN: dict[str, dict[str, Any]] = {
    "comb": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.statistical:CombForecaster",
        "defaults": {"season_length": "auto", "combine": "mean"},
        "accepts_any": False,
        "fits_series": True,
        "deterministic": True,
    },
    "ets": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.statistical:ETSForecaster",
        "defaults": {"season_length": "auto", "model": "ZZZ"},
        "accepts_any": False,
        "fits_series": True,
        "deterministic": True,
    },
    "gru": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.neural:GRUForecaster",
        "defaults": {"hidden_size": 64, "num_layers": 1, "dropout": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "lgbm": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.families:LGBMForecaster",
        "defaults": {"n_estimators": 300, "num_leaves": 31, "learning_rate": 0.05, "min_child_samples": 20, "subsample": 1.0, "colsample_bytree": 1.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "linear": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.families:LinearForecaster",
        "defaults": {"alpha": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "lstm": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.neural:LSTMForecaster",
        "defaults": {"hidden_size": 64, "num_layers": 1, "dropout": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "mlp": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.neural:MLPForecaster",
        "defaults": {"hidden_size": 128, "num_layers": 2, "dropout": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "nbeats": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.nbeats:NBeatsForecaster",
        "defaults": {"stacks": "generic", "blocks": 3, "layers": 4, "width": 256, "trend_degree": 3, "harmonics": None, "last_value_norm": False},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "rf": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.families:RandomForestForecaster",
        "defaults": {"n_estimators": 200, "max_depth": None, "min_samples_leaf": 1, "max_features": 1.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "snaive": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.statistical:SeasonalNaiveForecaster",
        "defaults": {"season_length": "auto"},
        "accepts_any": False,
        "fits_series": True,
        "deterministic": True,
    },
    "tcn": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.neural:TCNForecaster",
        "defaults": {"channels": 64, "kernel_size": 3, "num_levels": None, "dropout": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "theta": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.statistical:ThetaForecaster",
        "defaults": {"season_length": "auto"},
        "accepts_any": False,
        "fits_series": True,
        "deterministic": True,
    },
    "transformer": {
        "kind": "neural",
        "factory": "gpufill.forecasting.models.neural:TransformerForecaster",
        "defaults": {"d_model": 64, "nhead": 4, "num_layers": 2, "dim_feedforward": None, "dropout": 0.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
    "xgb": {
        "kind": "classical",
        "factory": "gpufill.forecasting.models.classical.families:XGBForecaster",
        "defaults": {"n_estimators": 300, "max_depth": 6, "learning_rate": 0.1, "subsample": 1.0, "colsample_bytree": 1.0, "last_value_norm": True},
        "accepts_any": False,
        "fits_series": False,
        "deterministic": False,
    },
}
