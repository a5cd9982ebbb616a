"""One trial's work as a message for the scheduler: its result, or its error and traceback.

A trial that fails is data for the store (retried up to the campaign's limit), not a
worker crash; every way of running trials (one at a time, in a fused pack) reports through this.
"""

from __future__ import annotations

import time
import traceback
from typing import Any


def attempt(trial: dict[str, Any], run: Any) -> dict[str, Any]:
    """Run one trial's work; its failure is data for the store, not a worker crash."""
    started = time.perf_counter()
    try:
        message = {"trial_id": trial["trial_id"], "ok": True, "result": run()}
    except Exception as error:
        message = {
            "trial_id": trial["trial_id"],
            "ok": False,
            "error": f"{type(error).__name__}: {error}".splitlines()[0],
            "traceback": traceback.format_exc(),
        }
    message["seconds"] = time.perf_counter() - started
    return message
