"""Model families: neural forecasters and the registry that names them.

Importing this package registers the built-in neural families.
"""

from gpufill.models.registry import Family, ModelKind, build, check_params, families, register, resolve
# importing neural registers lstm, gru, tcn, transformer, mlp
from gpufill.models.neural import (
    Forecaster,
    GRUForecaster,
    LSTMForecaster,
    MLPForecaster,
    TCNForecaster,
    TransformerForecaster,
)
# importing classical registers linear, rf, xgb, lgbm (their libraries load on first fit)
from gpufill.models import classical  # noqa: F401  (registers the classical families)

__all__ = [
    "Family",
    "Forecaster",
    "GRUForecaster",
    "LSTMForecaster",
    "MLPForecaster",
    "ModelKind",
    "TCNForecaster",
    "TransformerForecaster",
    "build",
    "check_params",
    "families",
    "register",
    "resolve",
]
