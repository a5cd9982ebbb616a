"""The task-agnostic training engine: any nn.Module, any loss, any batch.

It imports nothing from forecasting, campaign, report or the CLI. Names load lazily, so
`import gpufill.engine` costs nothing until one is used.
"""

from __future__ import annotations

from gpufill.lazy import by_home, lazy_names

# each submodule of gpufill.engine and the names it defines
_HOME = by_home({"loop": ["fit"], "config": ["FitConfig"], "result": ["FitResult", "FitCallback", "EpochRecord"], "plan": ["Plan", "Choice"]})
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
