"""gpufill: run deep-learning experiment campaigns, and any single training, at the speed of the hardware.

Names load lazily, on first use: `import gpufill` (and so `gpufill --help`) does not import
torch, pandas or the campaign machinery until something needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpufill.errors import InputError

__version__ = "0.1.0"

# name -> module that defines it
_HOME = {
    "fit": "gpufill.engine.loop",
    "fit_many": "gpufill.engine.packs.many",
    "FitConfig": "gpufill.engine.config",
    "FitResult": "gpufill.engine.result",
    "Plan": "gpufill.engine.plan",
    "Campaign": "gpufill.campaign.run.runner",
    "TrainingMonitor": "gpufill.monitor.training",
}
__all__ = ["InputError", "__version__", *sorted(_HOME)]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'gpufill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
