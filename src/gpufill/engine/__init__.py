"""The task-agnostic training engine: any nn.Module, any loss, any batch.

It imports nothing from forecasting, campaign, report or the CLI. Names load lazily, so
`import gpufill.engine` costs nothing until one is used.
"""

from __future__ import annotations

from gpufill.lazy import lazy_names

# name -> submodule of gpufill.engine that defines it
_HOME = {
    "fit": "loop",
    "FitConfig": "config",
    "FitResult": "result",
    "FitCallback": "result",
    "EpochRecord": "result",
    "Plan": "plan",
    "Choice": "plan",
}
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
