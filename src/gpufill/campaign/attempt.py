"""One trial's work as a message for the scheduler: its result, or its error and traceback.

A trial that fails is data for the store (retried up to the campaign's limit), not a
worker crash; every way of running trials (one at a time, in a fused pack) reports through this.
"""

from __future__ import annotations

import math
import time
import traceback
from typing import Any


class NonFiniteMetrics(ValueError):
    """A trial finished but its test metrics are NaN or infinite: a failure, not a result to rank."""


def attempt(trial: dict[str, Any], run: Any) -> dict[str, Any]:
    """Run one trial's work; its failure is data for the store, not a worker crash."""
    started = time.perf_counter()
    try:
        result = run()
        _check_finite(result)
        message = {"trial_id": trial["trial_id"], "ok": True, "result": result}
    except Exception as error:
        message = {
            "trial_id": trial["trial_id"],
            "ok": False,
            "error": f"{type(error).__name__}: {error}".splitlines()[0],
            "traceback": traceback.format_exc(),
        }
    message["seconds"] = time.perf_counter() - started
    return message


def _check_finite(result: dict[str, Any]) -> None:
    test = result.get("metrics", {}).get("test", {})
    bad = {name: value for name, value in test.items() if not math.isfinite(value)}
    if bad:
        listed = ", ".join(f"{name}={value}" for name, value in bad.items())
        raise NonFiniteMetrics(f"test metrics are not finite ({listed}): the predictions overflowed or the training diverged; "
                               "lower the learning rate, or check the data's scale")


def unfused_because(messages: list[dict[str, Any]], reason: str) -> None:
    """Record in each trained trial's plan why its shape trains one trial at a time."""
    for message in messages:
        plan = message.get("result", {}).get("plan") if message.get("ok") else None
        if isinstance(plan, dict):
            plan["pack_size"] = {"value": 1, "reason": reason}
