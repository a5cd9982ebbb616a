"""`gpufill monitor`: a live dashboard of a campaign, read from its store (running or finished).

It only reads (the scheduler is the store's one writer), so it can run in another
terminal or over ssh. A run whose scheduler is gone (no process holds the workdir lock) shows
as stopped: no rate, no ETA, no trial running. Sized for 80x24: lane counts, trials per minute, ETA, the running
trials, and sparklines of the last minute of each GPU (utilisation, memory, power,
temperature) and of the host CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpufill.campaign.results.reading import run_state, stopped_line, with_run
from gpufill.campaign.store.store import Store
from gpufill.errors import visible

_BARS = "▁▂▃▄▅▆▇█"
# Trials per minute is measured over this trailing window: recent enough to follow a
# lane's pace, long enough to smooth over single slow trials.
RATE_WINDOW_S = 300.0
SPARK_POINTS = 40


def sparkline(values: Sequence[float | None], top: float) -> str:
    """One character per value, scaled to [0, top]; missing values are blank."""
    chars = []
    for value in values[-SPARK_POINTS:]:
        if value is None or value != value or top <= 0:
            chars.append(" ")
            continue
        level = min(len(_BARS) - 1, max(0, int(value / top * (len(_BARS) - 1) + 0.5)))
        chars.append(_BARS[level])
    return "".join(chars)


def snapshot(workdir: str | Path, *, now: Callable[[], float] = time.time) -> dict[str, Any]:
    """Everything the dashboard shows, as plain data (tests assert on it)."""
    store = Store.open(workdir)
    try:
        run = run_state(workdir, store)
        stopped = run["state"] not in ("running", "none")
        counts = with_run(store.counts(), run).to_dict()
        t = now()
        finished_recently = store.db.execute(
            "SELECT COUNT(*) FROM trials WHERE status IN ('done', 'pruned', 'failed') AND finished_at >= ?", (t - RATE_WINDOW_S,)
        ).fetchone()[0]
        first_finish = store.db.execute("SELECT MIN(finished_at) FROM trials WHERE finished_at >= ?", (t - RATE_WINDOW_S,)).fetchone()[0]
        window = min(RATE_WINDOW_S, t - first_finish) if first_finish is not None else 0.0
        per_min = 60.0 * finished_recently / window if window > 0 and not stopped else 0.0
        left = counts["pending"] + counts["running"]
        running = [
            {"family": f, "project": p, "lane": lane, "worker": w, "seconds": t - (s or t)}
            for f, p, lane, w, s in store.db.execute(
                "SELECT family, project, lane, worker, started_at FROM trials WHERE status = 'running' ORDER BY started_at"
            )
        ] if not stopped else []
        series: dict[str, dict[str, list[float | None]]] = {}
        # A running campaign's last minutes; a finished or stopped one's last recorded minutes (samples are ~1 s apart).
        last = store.db.execute("SELECT MAX(ts) FROM samples").fetchone()[0] if store.has_samples() else None
        since = (t if run["state"] == "running" or last is None else last) - 2 * SPARK_POINTS
        rows = store.db.execute(
            "SELECT source, gpu_util, mem_used, mem_total, power_w, temp_c, cpu_percent FROM samples WHERE ts >= ? ORDER BY ts", (since,)
        ) if store.has_samples() else []
        for row in rows:
            source, util, used, total, power, temp, cpu = row
            target = series.setdefault(source, {"util": [], "mem": [], "power": [], "temp": [], "cpu": []})
            target["util"].append(util)
            target["mem"].append(100.0 * used / total if used is not None and total else None)
            target["power"].append(power)
            target["temp"].append(temp)
            target["cpu"].append(cpu)
        name = store.meta("campaign_name") or Path(workdir).name
        alerts = [m for (m,) in store.db.execute("SELECT message FROM events WHERE kind LIKE 'alert%' ORDER BY event_id DESC LIMIT 3")]
    finally:
        store.close()
    return {
        "campaign": name,
        "counts": counts,
        "trials_per_min": per_min,
        "eta_s": 0.0 if left == 0 else None if stopped else left * 60.0 / per_min if per_min > 0 else None,
        "run": run,
        "running": running,
        "series": series,
        "alerts": alerts,
    }


def render(data: dict[str, Any]) -> Group:
    counts = data["counts"]
    eta = data["eta_s"]
    state = (data.get("run") or {}).get("state", "running")
    if state in ("running", "none") or eta == 0.0:
        eta_text = "done" if eta == 0.0 else ("?" if eta is None else f"{int(eta // 60)}m{int(eta % 60):02d}s")
        pace = f"{data['trials_per_min']:.1f} trials/min, ETA {eta_text}"
    else:  # trials are left but no scheduler is running them: no pace, no ETA
        pace = f"not running (last run {state})"
    pruned = f", {counts['pruned']} pruned" if counts.get("pruned") else ""
    header = Text(f"{visible(data['campaign'])}: {counts['done']}/{counts['total']} done{pruned}, {counts['failed']} failed, {pace}", style="bold")
    lanes = Table(box=None, pad_edge=False, header_style="bold")
    shown = ("total", "done", *(("pruned",) if counts.get("pruned") else ()), "failed", "running", "pending", "skipped")
    for column in ("lane", *shown):
        lanes.add_column(column, justify="left" if column == "lane" else "right")
    for lane, c in counts["lanes"].items():
        lanes.add_row(lane, *(str(c.get(k, 0)) for k in shown))
    parts: list[Any] = [header, lanes]
    if state == "interrupted":
        parts.append(Text(stopped_line(data["run"], counts.get("interrupted", 0)), style="yellow"))
    resources = Table(box=None, pad_edge=False, header_style="bold")
    resources.add_column("source")
    resources.add_column("metric")
    resources.add_column("last minute", no_wrap=True)
    resources.add_column("now", justify="right")
    for source, s in sorted(data["series"].items()):
        if source == "host":
            resources.add_row("host", "cpu %", sparkline(s["cpu"], 100), _last(s["cpu"], "%"))
            continue
        resources.add_row(source, "util %", sparkline(s["util"], 100), _last(s["util"], "%"))
        resources.add_row("", "mem %", sparkline(s["mem"], 100), _last(s["mem"], "%"))
        resources.add_row("", "power W", sparkline(s["power"], max((v for v in s["power"] if v), default=1)), _last(s["power"], " W"))
        resources.add_row("", "temp C", sparkline(s["temp"], 100), _last(s["temp"], " C"))
    if data["series"]:
        parts.append(resources)
    else:
        parts.append(Text("no resource samples yet", style="dim"))
    running = Table(box=None, pad_edge=False, header_style="bold", title=None)
    for column in ("running", "project", "worker", "for"):
        running.add_column(column)
    for row in data["running"][:8]:
        running.add_row(Text(visible(row["family"])), Text(visible(row["project"])), Text(visible(row["worker"] or "")), f"{row['seconds']:.0f}s")
    if data["running"]:
        parts.append(running)
    for message in data.get("alerts", []):
        parts.append(Text(visible(f"alert: {message}"), style="bold red"))
    return Group(*parts)


def _last(values: Sequence[float | None], unit: str) -> str:
    real = [v for v in values if v is not None]
    return f"{real[-1]:.0f}{unit}" if real else "-"
