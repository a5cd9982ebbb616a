"""gpufill: run deep-learning experiment campaigns at the speed of the hardware."""

from gpufill.errors import InputError

__version__ = "0.1.0"

# Imported eagerly: binding `fit` here after the submodule `gpufill.fit` has loaded makes
# `gpufill.fit` the function, whatever imports the submodule later.
from gpufill.fit import FitConfig, FitResult, fit  # noqa: E402
from gpufill.plan import Plan  # noqa: E402
from gpufill.campaign.runner import Campaign  # noqa: E402
from gpufill.monitor.training import TrainingMonitor  # noqa: E402

__all__ = ["Campaign", "FitConfig", "FitResult", "InputError", "Plan", "TrainingMonitor", "__version__", "fit"]
