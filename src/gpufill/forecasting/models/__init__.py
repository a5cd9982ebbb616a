"""Model families: neural forecasters and the registry that names them.

Importing this package registers the built-in neural families.
"""

from gpufill.forecasting.models.registry import Family, ModelKind, build, check_params, families, register, resolve
# importing neural registers lstm, gru, tcn, transformer, mlp
from gpufill.forecasting.models.neural import (
    Forecaster,
    GRUForecaster,
    LSTMForecaster,
    MLPForecaster,
    TCNForecaster,
    TransformerForecaster,
)
# importing nbeats registers nbeats (N-BEATS, generic or interpretable stacks)
from gpufill.forecasting.models.nbeats import NBeatsForecaster
# importing classical registers linear, rf, xgb, lgbm and snaive, ets, theta (their libraries load on first fit)
from gpufill.forecasting.models import classical  # noqa: F401  (registers the classical families)
# importing the fused kernels registers them with the engine's packs (engine.packs.fused.fuses)
from gpufill.forecasting.models import fused_feedforward, fused_recurrent  # noqa: F401

__all__ = [
    "Family",
    "Forecaster",
    "GRUForecaster",
    "LSTMForecaster",
    "MLPForecaster",
    "ModelKind",
    "NBeatsForecaster",
    "TCNForecaster",
    "TransformerForecaster",
    "build",
    "check_params",
    "families",
    "register",
    "resolve",
]
