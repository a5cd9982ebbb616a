"""Importing this module registers every built-in family with the registry, and the fused kernels of their packs with
the engine (`engine.packs.fused.fuses`). The registry imports it the first time a built-in family is built; until
then a family is known from its description (`catalog.py`), and torch is not imported."""

from __future__ import annotations

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
from gpufill.forecasting.models import classical  # noqa: F401
# importing the fused kernels registers them with the engine's packs
from gpufill.forecasting.models import fused_feedforward, fused_recurrent  # noqa: F401

__all__ = ["Forecaster", "GRUForecaster", "LSTMForecaster", "MLPForecaster", "NBeatsForecaster", "TCNForecaster",
           "TransformerForecaster", "load"]


def load() -> None:
    """Nothing to do: importing this module did it (a name to call where `import builtin` alone reads as unused)."""
