"""The report's figures: matplotlib (Agg) rendered to base64 PNG, each with a title and axis labels with units.

Every function takes plain DataFrames and returns a `Plot` (or None when there is nothing
to draw, so the page shows a note instead of an empty image). Names and grid values are the user's
text: drawn literally (a `$` is escaped, never matplotlib mathtext; TeX is off whatever a matplotlibrc says).
"""

from __future__ import annotations

import base64
import io
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import matplotlib

matplotlib.use("Agg")  # no display, no GUI toolkit: the report renders on headless servers

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpufill.errors import visible  # noqa: E402
from gpufill.forecasting.metric_registry import METRICS  # noqa: E402

if TYPE_CHECKING:
    from gpufill.campaign.future.intervals import Calibration

GIB = 1024**3
REFERENCE_FAMILIES = ("snaive", "ets", "theta", "comb")
"""Statistical references drawn as lines across the family comparison."""
DPI = 90  # ~1000 px wide figures: sharp enough on screen, small enough to keep the page light


LEGEND_PAD_PT = 30
"""Title padding (points) above a one-row legend drawn on an axes' top edge: the legend's height plus a gap."""


@dataclass(frozen=True, slots=True)
class Plot:
    """One rendered figure: base64 PNG and the alt text that describes it."""

    png_base64: str
    alt: str


_F = TypeVar("_F", bound=Callable[..., Any])


def _drawn_as_text(function: _F) -> _F:
    """Runs a figure function with TeX off: a user's matplotlibrc with text.usetex would send names to LaTeX."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with plt.rc_context({"text.usetex": False}):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _literal(text: object) -> str:
    """The user's text as it is: `$` escaped so matplotlib draws it instead of reading mathtext (which crashes on
    `$\\frac{$`), control characters as their escapes (a font has no glyph for ESC)."""
    return visible(text).replace("$", r"\$")


def _render(fig: plt.Figure, alt: str) -> Plot:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return Plot(base64.b64encode(buffer.getvalue()).decode("ascii"), alt)


def _short(name: str, width: int = 24) -> str:
    """Custom families are `package.module:factory`: keep the factory name for axis labels."""
    name = name.rsplit(":", 1)[-1] if ":" in name else name
    return _literal(name if len(name) <= width else name[: width - 1] + "…")


# -- model comparison -------------------------------------------------------------------------
@_drawn_as_text
def metric_per_family(done: pd.DataFrame, metric: str = "mae") -> Plot | None:
    """Box plot of the test metric per family, with every trial as a point (one per project x config x seed)."""
    done = done.dropna(subset=[metric])
    if done.empty:
        return None
    families = sorted(done["family"].unique(), key=lambda f: done.loc[done["family"] == f, metric].median())
    values = [done.loc[done["family"] == f, metric].to_numpy() for f in families]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.boxplot(values, showfliers=False)
    ax.set_xticks(range(1, len(families) + 1), [_short(f) for f in families], rotation=20, ha="right")
    for i, vals in enumerate(values, start=1):
        ax.plot([i] * len(vals), vals, "o", alpha=0.5, markersize=3, color="tab:blue")
    references = [(f, float(np.median(v))) for f, v in zip(families, values, strict=True) if f in REFERENCE_FAMILIES]
    for (family, median), style in zip(references, ("--", ":", "-.", (0, (5, 1))), strict=False):  # the statistical references as lines across
        ax.axhline(median, linestyle=style, color="tab:red", linewidth=1.0, label=f"{family} (median)")
    if references:
        ax.legend(loc="upper left", fontsize="small")
    label = METRICS[metric].label
    ax.set_title(f"Test {label} per model family across projects (each point: one trial)")
    ax.set_xlabel("model family (sorted by median)")
    ax.set_ylabel(f"test {label} ({METRICS[metric].units})")
    ax.grid(axis="y", alpha=0.3)
    lines = f"; reference lines: {', '.join(f for f, _ in references)}" if references else ""
    return _render(fig, f"Box plot of test {label} per model family across {done['project'].nunique()} projects{lines}")


@_drawn_as_text
def parameter_effects(done: pd.DataFrame, metric: str = "mae", limit: int = 12) -> Plot | None:
    """Mean test metric per value of each grid parameter (and lookback) that varies, per family."""
    panels: list[tuple[str, str, pd.Series]] = []
    for family, rows in done.dropna(subset=[metric]).groupby("family"):
        params = pd.DataFrame([json.loads(p) for p in rows["params"]], index=rows.index)
        params["lookback"] = rows["lookback"]
        for name in params.columns:
            column = params[name].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
            if column.nunique(dropna=False) > 1:
                means = rows[metric].groupby(column).mean()
                means = means.iloc[sorted(range(len(means)), key=lambda i: _order(means.index[i]))]  # 8 before 16
                panels.append((str(family), _literal(name), means.rename(index=_literal)))
    if not panels:
        return None
    panels = panels[:limit]
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(max(8, 4 * cols), 3.4 * nrows), squeeze=False)
    for ax, (family, name, means) in zip(axes.flat, panels, strict=False):
        ax.bar(means.index, means.to_numpy(), color="tab:orange")
        ax.set_title(f"{_short(family)}: {name}")
        ax.set_xlabel(f"{name} (grid value)")
        ax.set_ylabel(f"mean test {METRICS[metric].label} ({METRICS[metric].units})")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"Hyper-parameter effects: mean test {METRICS[metric].label} per grid value")
    return _render(fig, f"Bar charts of mean test {METRICS[metric].label} per value of {len(panels)} varying grid parameters")


def _order(value: object) -> tuple[int, float, str]:
    """Numbers first in numeric order, then everything else by its text."""
    try:
        return (0, float(value), "")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


# -- resources --------------------------------------------------------------------------------
def _timeline(frames: dict[str, pd.DataFrame], column: str, scale: float, t0: float, title: str, ylabel: str, alt: str,
              since: str = "campaign start") -> Plot | None:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    drawn = False
    for source, rows in sorted(frames.items()):
        rows = rows.dropna(subset=[column])
        if rows.empty:
            continue
        ax.plot(rows["ts"] - t0, rows[column] / scale, label=source, linewidth=1.2)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_title(title)
    ax.set_xlabel(f"time since {since} (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    return _render(fig, alt)


@_drawn_as_text
def gpu_timelines(samples: pd.DataFrame, t0: float, since: str = "campaign start") -> list[Plot]:
    """Utilisation, memory, power, temperature and SM clock per GPU (empty when there are no GPU rows)."""
    gpus = {source: rows for source, rows in samples.groupby("source") if str(source).startswith("gpu")}
    if not gpus:
        return []
    specs = [
        ("gpu_util", 1, "GPU utilisation per GPU", "utilisation (%)"),
        ("mem_used", GIB, "GPU memory used per GPU", "memory used (GiB)"),
        ("power_w", 1, "GPU power draw per GPU", "power (W)"),
        ("temp_c", 1, "GPU temperature per GPU", "temperature (°C)"),
        ("sm_clock_mhz", 1, "GPU SM clock per GPU", "SM clock (MHz)"),
    ]
    plots = [_timeline(gpus, col, scale, t0, title, ylabel, f"Line chart: {title.lower()} over time", since) for col, scale, title, ylabel in specs]
    return [p for p in plots if p is not None]


@_drawn_as_text
def host_timelines(samples: pd.DataFrame, t0: float, since: str = "campaign start") -> list[Plot]:
    """CPU utilisation and RAM used by the host."""
    host = {"host": samples[samples["source"] == "host"]}
    if host["host"].empty:
        return []
    plots = [
        _timeline(host, "cpu_percent", 1, t0, "Host CPU utilisation (all cores)", "CPU utilisation (%)", "Line chart: host CPU utilisation over time", since),
        _timeline(host, "ram_used", GIB, t0, "Host RAM used", "RAM used (GiB)", "Line chart: host RAM used over time", since),
    ]
    return [p for p in plots if p is not None]


# -- durations --------------------------------------------------------------------------------
@_drawn_as_text
def durations(trials: pd.DataFrame) -> Plot | None:
    """Box plot of trial durations per family and lane (done and failed trials)."""
    rows = trials.dropna(subset=["duration_s"])
    if rows.empty:
        return None
    groups = sorted(rows.groupby([rows["family"], rows["lane"].fillna("cpu")]), key=lambda item: item[0])
    labels = [f"{_short(family)}\n({lane} lane)" for (family, lane), _ in groups]
    values = [group["duration_s"].to_numpy() for _, group in groups]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.boxplot(values)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right")
    low, high = rows["duration_s"].min(), rows["duration_s"].max()
    if low > 0 and high / low > 100:  # spans orders of magnitude (ms classical fits vs minute-long trainings)
        ax.set_yscale("log")
    ax.set_title("Trial duration per model family and lane")
    ax.set_xlabel("model family (lane)")
    ax.set_ylabel("duration (s)")
    ax.grid(axis="y", alpha=0.3)
    return _render(fig, f"Box plot of trial durations in seconds for {len(labels)} family/lane groups")


@_drawn_as_text
def search_progress(trials: pd.DataFrame, metric: str = "mae", grid: pd.DataFrame | None = None) -> Plot | None:
    """A search's course: each finished trial's validation score against the training seconds spent up to it (in the
    order the sampler proposed them), pruned trials marked, and the best finished score so far as a step line;
    `grid`: a full grid's trials over the same space, its best so far drawn beside (what the search saved)."""
    column = f"val_{metric}"
    rows = _scored(trials, column)
    if rows is None:
        return None
    spent = rows["duration_s"].cumsum()
    done = rows["status"] == "done"
    best = rows[column].where(done).cummin()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.scatter(spent[done], rows.loc[done, column], s=18, label="finished trial", color="tab:blue")
    ax.scatter(spent[~done], rows.loc[~done, column], s=24, marker="x", label="pruned (its score where it stopped)", color="tab:red")
    ax.step(spent, best, where="post", color="black", label="best finished so far")
    beside = ""
    grid_rows = _scored(grid, column) if grid is not None else None
    if grid_rows is not None:
        grid_done = grid_rows["status"] == "done"
        ax.step(grid_rows["duration_s"].cumsum(), grid_rows[column].where(grid_done).cummin(), where="post", color="tab:gray",
                linestyle="--", label=f"full grid's best so far ({len(grid_rows)} trials)")
        ax.set_xscale("log")  # the grid spends several times the search's seconds: both courses stay readable
        beside = f", beside the full grid's best so far over {len(grid_rows)} trials"
    ax.set_title(f"Search: validation {metric} against training seconds spent")
    ax.set_xlabel("training seconds, summed over trials in proposal order" + (" (log scale)" if beside else ""))
    ax.set_ylabel(f"validation {metric}")
    ax.grid(alpha=0.3)
    ax.legend()
    return _render(fig, f"Scatter of {len(rows)} trials' validation {metric} against cumulative training seconds, "
                        f"{int((~done).sum())} pruned, with the best finished score so far{beside}")


def _scored(trials: pd.DataFrame, column: str) -> pd.DataFrame | None:
    """The finished and pruned trials with a duration, or None where none carries a score in `column`."""
    rows = trials[trials["status"].isin(["done", "pruned"])].dropna(subset=["duration_s"])
    if rows.empty or column not in rows or rows[column].isna().all():
        return None
    return rows


# -- a watched script's steps -----------------------------------------------------------------
PHASE_COLOURS = {"data_wait": "tab:red", "copy": "tab:orange", "forward": "tab:blue", "backward": "tab:green", "optimizer": "tab:purple"}


@_drawn_as_text
def step_timelines(buckets: pd.DataFrame, t0: float) -> list[Plot]:
    """Mean step time and data wait per time bucket, and optimizer steps per second (a watched script's timeline)."""
    if buckets.empty:
        return []
    middle = (buckets["t0"] + buckets["t1"]) / 2 - t0
    steps = buckets["steps"].clip(lower=1)
    marker = "o" if len(buckets) < 30 else None  # a short run has a few points: show them
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(middle, buckets["step_s"] / steps * 1e3, label="step", linewidth=1.2, color="black", marker=marker)
    ax.plot(middle, buckets["data_s"] / steps * 1e3, label="waiting for data", linewidth=1.2, color=PHASE_COLOURS["data_wait"], marker=marker)
    ax.plot(middle, buckets["copy_s"] / steps * 1e3, label="host-to-device copy", linewidth=1.0, color=PHASE_COLOURS["copy"], marker=marker)
    _since_start(ax, "Training step time and data wait (mean per interval)", "time per step (ms)")
    ax.legend(loc="upper right", fontsize="small")
    timeline = _render(fig, "Line chart: mean training step time and data wait per interval over time")
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(middle, buckets["steps"] / (buckets["t1"] - buckets["t0"]).clip(lower=1e-9), linewidth=1.2, marker=marker)
    _since_start(ax, "Optimizer steps per second", "steps/s")
    return [timeline, _render(fig, "Line chart: optimizer steps per second over time")]


def _since_start(ax: plt.Axes, title: str, ylabel: str) -> None:
    """A watched run's axes: time from the command's start, both axes from zero."""
    ax.set_title(title)
    ax.set_xlabel("time since the command started (s)")
    ax.set_ylabel(ylabel)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


@_drawn_as_text
def step_breakdown(shares: dict[str, float], step_ms: float) -> Plot:
    """One horizontal bar: each phase's share of a step."""
    return _render(step_breakdown_figure(shares, step_ms), "Stacked bar: " + ", ".join(f"{phase} {share:.0%}" for phase, share in shares.items()))


def step_breakdown_figure(shares: dict[str, float], step_ms: float) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(10, 2.4))
    left = 0.0
    for phase, share in shares.items():
        ax.barh([0], [share * 100], left=left, color=PHASE_COLOURS.get(phase, "grey"), label=f"{phase.replace('_', ' ')} {share:.0%}")
        left += share * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel(f"share of a {step_ms:.3g} ms step (%)")
    # The legend sits on the bar's top edge and the title above it, with room for both (a 2.4 in figure
    # has no space for the legend inside the bar, and an anchor above the title's pad drew one over the other).
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(shares), fontsize="small", frameon=False, borderaxespad=0.2)
    ax.set_title("Where a training step's time goes", pad=LEGEND_PAD_PT)
    fig.tight_layout()
    return fig


# -- forecasts --------------------------------------------------------------------------------
FORECAST_PATHS = 4
"""Multi-step forecasts drawn per panel: as many origins, evenly spread over the test region, the last always among
them (every window's path would hide the actual line)."""


@_drawn_as_text
def forecasts(panels: list[tuple[str, str, str, dict[str, np.ndarray]]], bands: dict[tuple[str, str], Calibration] | None = None
              ) -> Plot | None:
    """Actual vs forecast over the test windows, every horizon step, one row per family with its best and worst project
    side by side. `panels`: (family, "best"/"worst", project, stored forecast) in row order; `bands`: per (family,
    project), its intervals' Calibration (campaign/future/intervals.py: from the validation windows), shaded around
    the forecast (a quantile network's: its own band, moved). Horizon 1: the one-step-ahead forecast of every window as
    a line; longer: the paths of FORECAST_PATHS windows, each marked at its origin."""
    if not panels:
        return None
    bands = bands or {}
    families = list(dict.fromkeys(family for family, *_ in panels))
    horizon = int(np.shape(panels[0][3]["forecast"])[1])
    fig, axes = plt.subplots(len(families), 2, figsize=(10, 1.9 * len(families) + 0.6), squeeze=False)
    for ax in axes.ravel():
        ax.set_visible(False)
    for family, which, project, kept in panels:
        ax = axes[families.index(family), 0 if which == "best" else 1]
        ax.set_visible(True)
        origins, forecast, truth = np.asarray(kept["origins"]), np.asarray(kept["forecast"]), np.asarray(kept["truth"])
        steps = np.arange(forecast.shape[1])
        times = (origins[:, None] + steps).ravel()
        actual = dict(zip(times.tolist(), truth.ravel().tolist()))  # each time's value, once
        ax.plot(sorted(actual), [actual[t] for t in sorted(actual)], color="black", linewidth=1.0, label="actual")
        calibration = bands.get((family, project))
        levels = sorted(level for level, width in calibration.half_widths.items() if np.isfinite(width).all()) if calibration else []
        quantiles = np.asarray(kept["quantiles"]) if kept.get("quantiles") is not None else None
        drawn = range(len(origins)) if forecast.shape[1] == 1 else sorted({int(round(i)) for i in np.linspace(0, len(origins) - 1, FORECAST_PATHS)})
        for index in ([slice(None)] if forecast.shape[1] == 1 else drawn) if levels else ():
            x = origins[index] if forecast.shape[1] == 1 else origins[index] + steps
            y = forecast[index, 0] if forecast.shape[1] == 1 else forecast[index]
            own = None if quantiles is None else quantiles[index, 0] if forecast.shape[1] == 1 else quantiles[index]
            bounds = calibration.intervals(y, levels, own)  # as gpufill forecast gives them
            for shade, level in zip(("0.35", "0.18"), levels):
                ax.fill_between(x, *bounds[level], color="tab:orange", alpha=float(shade), linewidth=0,
                                label=f"{level:g} % interval" if index in (slice(None), drawn[0]) else None)
        if forecast.shape[1] == 1:
            ax.plot(origins, forecast[:, 0], color="tab:orange", linewidth=1.0, label="forecast (1 step ahead)")
        else:
            for index in drawn:
                ax.plot(origins[index] + steps, forecast[index], color="tab:orange", linewidth=1.0, marker=".", markersize=3,
                        label=f"forecast ({horizon} steps from an origin)" if index == drawn[0] else None)
        ax.set_title(f"{_short(family)}: {which} project {_literal(project)}", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize="x-small")
    fig.supxlabel("time step (test region)", fontsize="small")
    fig.supylabel("target (original scale)", fontsize="small")
    shown = f"every one of {horizon} steps" if horizon > 1 else "one step ahead"
    with_bands = ", with intervals from the validation errors" if bands else ""
    return _render(fig, f"Line charts: actual vs forecast over the test windows ({shown}{with_bands}), best and worst project of {len(families)} families")
