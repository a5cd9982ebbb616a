"""A model module that segfaults when imported (used by name in test_user_models.py): the scheduler must never import it."""

import ctypes
import os
from pathlib import Path

Path(os.environ["GPUFILL_TEST_IMPORTED_BY"]).write_text(str(os.getpid()))  # who imported it
ctypes.string_at(0)  # SIGSEGV


def make(n_features: int, lookback: int, horizon: int):  # never reached
    raise AssertionError("unreachable")
