"""The task-agnostic training engine: any nn.Module, any loss, any batch.

It imports nothing from forecasting, campaign, report or the CLI. Names load lazily, so
`import gpufill.engine` costs nothing until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"gpufill.engine.{_HOME[name]}"), name)
    raise AttributeError(f"module 'gpufill.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
