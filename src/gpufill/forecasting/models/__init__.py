"""Model families: neural forecasters and the registry that names them.

Names load lazily, on first use: `registry` knows every built-in family from its description (`catalog.py`) and
imports the families themselves (`builtin.py`: torch, the fused kernels) only when one is built or a class is asked
for here.
"""

from __future__ import annotations

from gpufill.lazy import lazy_names

# name -> submodule of gpufill.forecasting.models that defines it
_HOME = {
    **dict.fromkeys(["Family", "ModelKind", "build", "check_params", "families", "register", "resolve"], "registry"),
    **dict.fromkeys(["Forecaster", "GRUForecaster", "LSTMForecaster", "MLPForecaster", "NBeatsForecaster", "TCNForecaster",
                     "TransformerForecaster"], "builtin"),
}
__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_names(__name__, _HOME)
