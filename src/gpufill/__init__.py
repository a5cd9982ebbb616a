"""gpufill: run deep-learning experiment campaigns at the speed of the hardware."""

from gpufill.errors import InputError

__version__ = "0.1.0"

__all__ = ["InputError", "__version__"]
