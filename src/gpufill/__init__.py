"""gpufill: run deep-learning experiment campaigns, and any single training, at the speed of the hardware.

Names load lazily, on first use: `import gpufill` (and so `gpufill --help`) does not import
torch, pandas or the campaign machinery until something needs them.
"""

from __future__ import annotations

from gpufill.errors import InputError
from gpufill.lazy import lazy_names

__version__ = "0.1.0"

# name -> submodule of gpufill that defines it
_HOME = {
    "fit": "engine.loop",
    "fit_many": "engine.packs.many",
    "FitConfig": "engine.config",
    "FitResult": "engine.result",
    "Plan": "engine.plan",
    "Campaign": "campaign.run.runner",
    "TrainingMonitor": "monitor.training",
}
__all__ = ["InputError", "__version__", *sorted(_HOME)]


__getattr__, __dir__ = lazy_names(__name__, _HOME)
