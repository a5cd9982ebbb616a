"""Means and peaks of sampler rows (sampler.py), per source: the one-line view of a run's machine."""

from __future__ import annotations

import statistics
from typing import Any

from gpufill.monitor.alerts import harmful_reasons

__all__ = ["summarise"]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means and peaks of the sampled timeline, per source (host; gpu0, gpu1, ...)."""

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 2) if values else None

    out: dict[str, Any] = {}
    for source in sorted({row["source"] for row in rows}):
        mine = [row for row in rows if row["source"] == source]

        def values(key: str, mine: list[dict[str, Any]] = mine) -> list[float]:
            return [float(row[key]) for row in mine if row.get(key) is not None]

        if source == "host":
            out[source] = {"samples": len(mine), "cpu_percent_mean": mean(values("cpu_percent")),
                           "ram_used_gib_peak": round(max(values("ram_used"), default=0.0) / 2**30, 2)}
            if values("workers_rss"):  # the sampled processes (a watched command and its children)
                out[source]["processes_rss_gib_peak"] = round(max(values("workers_rss")) / 2**30, 2)
        else:
            out[source] = {"samples": len(mine), "util_percent_mean": mean(values("gpu_util")),
                           "memory_used_gib_peak": round(max(values("mem_used"), default=0.0) / 2**30, 2),
                           "power_w_mean": mean(values("power_w")), "temp_c_peak": max(values("temp_c"), default=None),
                           "sm_clock_mhz_mean": mean(values("sm_clock_mhz")),
                           "throttled_samples": sum(1 for row in mine if harmful_reasons(row))}
    return out

