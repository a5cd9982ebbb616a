"""The built-in model families: the one list of their names, kinds and factories.

The registry (`registry.py`) imports this module the first time a built-in family is built, and registers what it
lists; until then a family is known from its description (`catalog.py`, written from this list by
`tools/family_catalog.py`) and torch is not imported. Importing it also registers the fused kernels of the families'
packs with the engine (`engine.packs.fused.fuses`). The family modules import nothing of the registry: the
dependencies run one way, registry -> builtin -> families.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

# importing the fused kernels registers them with the engine's packs (`engine.packs.fused.fuses`)
from gpufill.forecasting.models import fused_feedforward, fused_recurrent  # noqa: F401
from gpufill.forecasting.models.classical.families import (
    LGBMForecaster,
    LinearForecaster,
    RandomForestForecaster,
    XGBForecaster,
)
from gpufill.forecasting.models.classical.statistical import (
    CombForecaster,
    ETSForecaster,
    SeasonalNaiveForecaster,
    ThetaForecaster,
)
from gpufill.forecasting.models.nbeats import NBeatsForecaster
from gpufill.forecasting.models.neural import (
    Forecaster,
    GRUForecaster,
    LSTMForecaster,
    MLPForecaster,
    TCNForecaster,
    TransformerForecaster,
)

__all__ = ["FAMILIES", "Forecaster", "GRUForecaster", "LSTMForecaster", "MLPForecaster", "NBeatsForecaster", "TCNForecaster",
           "TransformerForecaster"]

FAMILIES: Mapping[str, Mapping[str, Callable[..., Any]]] = MappingProxyType({
    # neural: the GPU lane; N-BEATS generic or interpretable stacks
    "neural": MappingProxyType({
        "lstm": LSTMForecaster,
        "gru": GRUForecaster,
        "tcn": TCNForecaster,
        "transformer": TransformerForecaster,
        "mlp": MLPForecaster,
        "nbeats": NBeatsForecaster,
    }),
    # classical: the CPU lane; window regressors (their libraries load on first fit), then the statistical references
    "classical": MappingProxyType({
        "linear": LinearForecaster,
        "rf": RandomForestForecaster,
        "xgb": XGBForecaster,
        "lgbm": LGBMForecaster,
        "snaive": SeasonalNaiveForecaster,
        "ets": ETSForecaster,
        "theta": ThetaForecaster,
        "comb": CombForecaster,
    }),
})
"""kind -> name -> factory of every built-in family."""
