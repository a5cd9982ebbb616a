"""Alerts: pure functions over sample rows (see sampler.py) and lane snapshots.

Each check finds *episodes* — runs of consecutive samples of one source for which a
condition holds — and returns one :class:`Alert` per episode, stamped with the episode's
first timestamp. A gap of more than ``MAX_GAP_S`` between two samples (the sampler was
stopped, the machine slept) ends an episode. Rows may come straight from the sampler or
back from the store (lists as JSON text, missing values as None or NaN).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["HARMFUL_THROTTLE", "Alert", "all_alerts", "harmful_reasons", "high_memory", "idle_lane", "input_wait", "low_gpu_utilisation", "throttling"]

# Longer than any sensible sampling interval, shorter than a stopped-and-restarted sampler.
MAX_GAP_S = 60.0
# Throttle reasons that cost speed because of heat or power (idle, sync boost and
# application clocks are normal states, not problems).
HARMFUL_THROTTLE = ("thermal", "hw_thermal", "power_cap", "hw_slowdown", "hw_power_brake")

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Alert:
    kind: str
    """``low_gpu_util``, ``high_memory``, ``throttling``, ``idle_lane`` or ``input_wait``."""
    message: str
    ts: float
    """Start of the episode."""
    source: str = ""
    """``gpu0``... for sample alerts, the lane for ``idle_lane``."""
    duration_s: float = 0.0
    """Last minus first timestamp of the episode."""


def _value(row: Row, key: str) -> Any:
    value = row.get(key)
    return None if isinstance(value, float) and math.isnan(value) else value


def _gpu_rows(rows: Iterable[Row]) -> dict[str, list[Row]]:
    by_source: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if str(row.get("source", "")).startswith("gpu"):
            by_source[row["source"]].append(row)
    for series in by_source.values():
        series.sort(key=lambda r: r["ts"])
    return dict(sorted(by_source.items()))


def _episodes(series: Sequence[Any], ts: Callable[[Any], float], holds: Callable[[Any], bool]) -> list[list[Any]]:
    """Maximal runs of consecutive items for which ``holds`` is true (a gap > MAX_GAP_S splits a run)."""
    episodes: list[list[Any]] = []
    current: list[Any] = []
    for item in series:
        if holds(item) and (not current or ts(item) - ts(current[-1]) <= MAX_GAP_S):
            current.append(item)
            continue
        if current:
            episodes.append(current)
        current = [item] if holds(item) else []
    if current:
        episodes.append(current)
    return episodes


def low_gpu_utilisation(rows: Iterable[Row], *, threshold: float = 30.0, min_duration_s: float = 60.0,
                        busy: Callable[[float], bool] = lambda ts: True, work: str = "trials ran") -> list[Alert]:
    """Utilisation below ``threshold`` % for at least ``min_duration_s`` while work was running (``busy(ts)``)."""
    alerts = []
    for source, series in _gpu_rows(rows).items():
        def low(row: Row) -> bool:
            util = _value(row, "gpu_util")
            return util is not None and util < threshold and busy(row["ts"])

        for episode in _episodes(series, lambda r: r["ts"], low):
            duration = episode[-1]["ts"] - episode[0]["ts"]
            if duration < min_duration_s:
                continue
            mean = sum(r["gpu_util"] for r in episode) / len(episode)
            alerts.append(Alert("low_gpu_util", f"{source}: utilisation {mean:.0f}% on average for {duration:.0f} s "
                                f"while {work} (below {threshold:g}%): the GPU is waiting on data, the CPU or too small work",
                                episode[0]["ts"], source, duration))
    return alerts


def high_memory(rows: Iterable[Row], threshold: float = 0.90) -> list[Alert]:
    """Memory used above ``threshold`` (a fraction) of the total."""
    alerts = []
    for source, series in _gpu_rows(rows).items():
        def high(row: Row) -> bool:
            used, total = _value(row, "mem_used"), _value(row, "mem_total")
            return used is not None and bool(total) and used / total > threshold

        for episode in _episodes(series, lambda r: r["ts"], high):
            peak = max(episode, key=lambda r: r["mem_used"] / r["mem_total"])
            share = peak["mem_used"] / peak["mem_total"]
            alerts.append(Alert("high_memory", f"{source}: memory {share:.0%} used (peak {peak['mem_used'] / 2**30:.1f} of "
                                f"{peak['mem_total'] / 2**30:.1f} GiB), above {threshold:.0%}: close to out of memory",
                                episode[0]["ts"], source, episode[-1]["ts"] - episode[0]["ts"]))
    return alerts


def harmful_reasons(row: Row) -> tuple[str, ...]:
    """The throttle reasons of a row that cost speed (heat, power), from a list or JSON text."""
    value = _value(row, "throttle")
    if isinstance(value, str):
        value = json.loads(value) if value else []
    return tuple(r for r in (value or ()) if r in HARMFUL_THROTTLE)


def throttling(rows: Iterable[Row]) -> list[Alert]:
    """Clocks held down by heat or power (thermal, power cap, hardware slowdown), one alert per episode."""
    alerts = []
    for source, series in _gpu_rows(rows).items():
        for episode in _episodes(series, lambda r: r["ts"], lambda r: bool(harmful_reasons(r))):
            seen = sorted({reason for row in episode for reason in harmful_reasons(row)}, key=HARMFUL_THROTTLE.index)
            duration = episode[-1]["ts"] - episode[0]["ts"]
            alerts.append(Alert("throttling", f"{source}: clocks throttled ({', '.join(seen)}) for {duration:.0f} s",
                                episode[0]["ts"], source, duration))
    return alerts


def idle_lane(snapshots: Iterable[tuple[float, str, int, int]], min_duration_s: float = 30.0) -> list[Alert]:
    """From ``(ts, lane, running, pending)`` snapshots: a lane running nothing while work waits."""
    by_lane: dict[str, list[tuple[float, str, int, int]]] = defaultdict(list)
    for snapshot in snapshots:
        by_lane[snapshot[1]].append(snapshot)
    alerts = []
    for lane, series in sorted(by_lane.items()):
        series.sort(key=lambda s: s[0])
        for episode in _episodes(series, lambda s: s[0], lambda s: s[2] == 0 and s[3] > 0):
            duration = episode[-1][0] - episode[0][0]
            if duration < min_duration_s:
                continue
            waiting = max(s[3] for s in episode)
            alerts.append(Alert("idle_lane", f"{lane} lane idle for {duration:.0f} s with up to {waiting} trials waiting",
                                episode[0][0], lane, duration))
    return alerts


def input_wait(buckets: Iterable[Row], *, share: float, min_duration_s: float = 30.0) -> list[Alert]:
    """A training's own step timeline (summed step and data-wait seconds per interval, `t0`/`t1`):
    waiting for data (and its copy) at or above ``share`` of the step time for ``min_duration_s``."""
    def waiting(bucket: Row) -> bool:
        return bucket["step_s"] > 0 and (bucket["data_s"] + bucket["copy_s"]) / bucket["step_s"] >= share

    alerts = []
    for episode in _episodes(sorted(buckets, key=lambda b: b["t0"]), lambda b: b["t0"], waiting):
        duration = episode[-1]["t1"] - episode[0]["t0"]
        if duration < min_duration_s:
            continue
        waited = sum(b["data_s"] + b["copy_s"] for b in episode) / sum(b["step_s"] for b in episode)
        alerts.append(Alert("input_wait", f"the training waited for data {waited:.0%} of its step time for {duration:.0f} s "
                            f"(at or above {share:.0%}): the DataLoader cannot keep up", episode[0]["t0"], "training", duration))
    return alerts


def all_alerts(rows: Iterable[Row], *, snapshots: Iterable[tuple[float, str, int, int]] = (),
               busy: Callable[[float], bool] = lambda ts: True, util_threshold: float = 30.0,
               util_min_duration_s: float = 60.0, memory_threshold: float = 0.90,
               idle_min_duration_s: float = 30.0, work: str = "trials ran") -> list[Alert]:
    """Every check, ordered by time."""
    rows = list(rows)
    alerts = [
        *low_gpu_utilisation(rows, threshold=util_threshold, min_duration_s=util_min_duration_s, busy=busy, work=work),
        *high_memory(rows, threshold=memory_threshold),
        *throttling(rows),
        *idle_lane(snapshots, min_duration_s=idle_min_duration_s),
    ]
    return sorted(alerts, key=lambda a: (a.ts, a.kind, a.source))


class AlertWatch:
    """Alerts over a sliding window of a running campaign's samples and lane snapshots, each episode said once.

    Feed it every sample row and lane snapshot as they come (`add`); `due(now)` says whether a check is due (every
    `every_s`); `check(now)` returns the alerts not said before over the last `window_s`. Pure: the caller gives
    the time and says the alerts (the scheduler writes them to the store)."""

    def __init__(self, *, window_s: float = 600.0, every_s: float = 30.0):
        self.window_s, self.every_s = window_s, every_s
        self.rows: list[Row] = []
        self.snapshots: list[tuple[float, str, int, int]] = []
        """(ts, lane, trials running, trials waiting)."""
        self.said: set[tuple[str, str, float]] = set()
        self.last_check = 0.0

    def add(self, rows: Iterable[Row], snapshots: Iterable[tuple[float, str, int, int]]) -> None:
        self.rows.extend(rows)
        self.snapshots.extend(snapshots)

    def due(self, now: float) -> bool:
        return now - self.last_check >= self.every_s

    def check(self, now: float) -> list[Alert]:
        self.last_check = now
        self.rows = [r for r in self.rows if r["ts"] >= now - self.window_s]
        self.snapshots = [s for s in self.snapshots if s[0] >= now - self.window_s]
        gpu_busy = [(ts, running) for ts, lane, running, _ in self.snapshots if lane.startswith("gpu")]

        def busy(ts: float) -> bool:  # were GPU trials running then? (the nearest earlier lane snapshot)
            earlier = [running for t, running in gpu_busy if t <= ts]
            return bool(earlier and earlier[-1])

        new = []
        for alert in all_alerts(self.rows, snapshots=self.snapshots, busy=busy):
            key = (alert.kind, alert.source, round(alert.ts, 1))
            if key not in self.said:
                self.said.add(key)
                new.append(alert)
        return new
