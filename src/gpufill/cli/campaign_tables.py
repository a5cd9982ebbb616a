"""Rich tables of a campaign: live progress, status counts, results, the estimate.

Apart from the training renders (render.py) so that `status` and `results` import neither torch nor
the engine: they answer from a large store in well under a second.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpufill.campaign.results.reading import CHOSEN_ON_TEST, CHOSEN_ON_VALIDATION, REFERENCES, summary_columns
from gpufill.errors import visible
from gpufill.forecasting.trial import METRICS


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def campaign_view(snapshot: Any, title: str = "campaign") -> Table:
    """Per-lane progress, rate and ETA, and the trials running now (fits 80 columns)."""
    table = Table(title=f"{escape(visible(title))}  {_duration(snapshot.elapsed_s)} elapsed  {snapshot.trials_per_min:.1f} trials/min", title_justify="left")
    table.add_column("lane", style="bold")
    table.add_column("progress")
    table.add_column("done", justify="right")
    table.add_column("fail", justify="right")
    table.add_column("run", justify="right")
    table.add_column("wait", justify="right")
    table.add_column("ETA", justify="right")
    for name, lane in snapshot.lanes.items():
        total = max(lane.total, 1)
        filled = int(16 * (lane.done + lane.pruned + lane.failed) / total)
        bar = "[green]" + "█" * filled + "[/green]" + "░" * (16 - filled)
        table.add_row(f"{name} ({lane.slots}x{lane.threads}t)", bar, str(lane.done) + (f" +{lane.pruned} pruned" if lane.pruned else ""), str(lane.failed), str(lane.running), str(lane.pending), _duration(snapshot.eta_s(name)))
    for trial in snapshot.running[:6]:
        table.add_row("", Text(visible(f"{trial['family']} {trial['project']}"), style="dim"), "", "", f"[dim]{trial['seconds']:.0f}s[/dim]", "", "")
    return table


def status_table(counts: dict[str, Any]) -> Table:
    table = Table(title="trials", title_justify="left")
    columns = ("total", "pending", "running", "done", *(("pruned",) if counts.get("pruned") else ()), "failed", "skipped")
    table.add_column("lane", style="bold")
    for column in columns:
        table.add_column(column, justify="right")
    for lane, lane_counts in counts["lanes"].items():
        table.add_row(Text(visible(lane)), *(str(lane_counts.get(c, 0)) for c in columns))
    table.add_row("all", *(str(counts[c]) for c in columns), style="bold")
    return table


# The table view shows what a reader scans; csv/json/parquet keep every column.
_TRIAL_COLUMNS = ("trial_id", "project", "family", "params", "train", "seed", "lookback", "status", "attempts", "lane", "duration_s")
"""And a column of each metric (METRICS), read when a table is drawn."""
_STALE_COLUMNS = ("trial_id", "project", "family", "params", "train", "seed", "lookback", "stale", "status", "mae", "differs")
_WRAPPED = ("params", "train", "differs")
"""Columns that wrap onto more lines; the others keep one line (cut, not wrapped, when the terminal is narrow)."""


TABLE_ROWS = 100
"""Rows the table view prints (a terminal's worth; --format csv has them all)."""


def results_table(rows: Any, *, summary: bool, total: int | None = None, stale_view: bool = False, max_rows: int = TABLE_ROWS,
                  metric: str = "mae") -> Table:
    """`rows`: dicts (or a DataFrame) of trials, or of best configurations with `summary` (ranked by `metric`, the
    campaign's task.metric); `total`: how many there are in all when `rows` holds only the first ones; `stale_view`:
    --all (stale rows and what differs)."""
    if hasattr(rows, "to_dict"):
        stale_view = stale_view or "differs" in rows.columns
        rows = rows.to_dict("records")
    total = len(rows) if total is None else total
    rows = [dict(row) for row in rows[:max_rows]]
    if rows and "train" in rows[0]:
        for row, shown in zip(rows, _varying_settings([row["train"] for row in rows]), strict=True):
            row["train"] = shown
    if summary:
        columns = [c for c in summary_columns(metric, stale=True) if c != "stale" or stale_view]
    else:
        columns = list(_STALE_COLUMNS if stale_view else (*_TRIAL_COLUMNS, *METRICS))  # with --all: room for what differs
    columns = [c for c in columns if not rows or c in rows[0]]
    for family in REFERENCES:  # a reference the campaign does not have: no empty column
        if not any(row.get(f"vs_{family}") is not None for row in rows):
            columns = [c for c in columns if c != f"vs_{family}"]
    if not any(row.get(f"val_{metric}") is not None for row in rows):
        columns = [c for c in columns if c != f"val_{metric}"]
    if summary and rows and not any(row.get("train") for row in rows):  # no train setting varies: no empty column
        columns = [c for c in columns if c != "train"]
    seeds = {row.get("seeds") for row in rows}
    if summary and len(seeds) == 1:  # the same count on every row: said once in the title, not in a column
        columns = [c for c in columns if c != "seeds"]
    stale = sum(1 for row in rows if row.get("stale"))
    over = f"mean over {seeds.pop()} seed{'s' if rows[0].get('seeds') != 1 else ''}" if summary and len(seeds) == 1 else "mean over seeds"
    what = f"best configuration per project and family ({over})" if summary else f"{total} trials"
    title = what + (f", {stale} shown are stale (from an earlier file or data)" if stale else "")
    if summary and any(row.get("chosen_on") == CHOSEN_ON_TEST for row in rows):
        title += "; by test: no validation window (task.split.val chooses without the test)"
    if total > max_rows:
        title += f" (first {max_rows}; --format csv for all)"
    table = Table(title=title, title_justify="left", pad_edge=False, box=None, header_style="bold")
    numeric = {c for c in columns if any(isinstance(row.get(c), int | float) and not isinstance(row.get(c), bool) for row in rows)}
    return _filled(table, columns, [[_cell(name, row.get(name)) for name in columns] for row in rows], right=numeric, wrapped=_WRAPPED)


def winners_table(rows: list[dict[str, Any]], metric: str = "mae") -> Table:
    """`results --best`: each project's best configuration across families (reading.winners), one line each."""
    rows = [dict(row) for row in rows]
    if rows and all("train" in row for row in rows):  # a search's sampled lr or scaling, say: what differs between the rows
        for row, shown in zip(rows, _varying_settings([row["train"] for row in rows]), strict=True):
            row["train"] = shown
    columns = ["project", "family", "params", "train", "lookback", metric, *(f"vs_{family}" for family in REFERENCES), "runner_up"]
    columns = [c for c in columns if not c.startswith("vs_") or any(row.get(c) is not None for row in rows)]
    columns = [c for c in columns if c != "train" or any(row.get("train") for row in rows)]
    counts = {row["families"] for row in rows}
    families = f"{counts.pop()} families" if len(counts) == 1 else f"up to {max(counts, default=0)} families"
    on = {row.get("chosen_on") for row in rows}
    ranked = ("ranked on the validation window; test scores shown" if on == {CHOSEN_ON_VALIDATION} else
              "ranked on the test window: no validation window (task.split.val chooses without the test)" if on == {CHOSEN_ON_TEST} else
              "ranked on the validation window where every family has one, else on the test window")
    table = Table(title=f"best configuration per project, of {families} ({ranked}; runner-up: how much worse)",
                  title_justify="left", pad_edge=False, box=None, header_style="bold")
    cells = []
    for row in rows:
        worse = row.get("runner_up_by")
        runner_up = "" if row["runner_up"] is None else f"{row['runner_up']} +{worse:.0%}" if worse is not None else row["runner_up"]
        cells.append([visible(runner_up) if column == "runner_up" else _cell(column, row.get(column)) for column in columns])
    return _filled(table, columns, cells, right={metric, *(f"vs_{family}" for family in REFERENCES), "lookback"}, wrapped=("params", "train"))


def _filled(table: Table, columns: list[str], cells: list[list[str]], *, right: set[str], wrapped: tuple[str, ...]) -> Table:
    """`table` with its columns (numbers right-aligned; only `wrapped` ones wrap, between words) and rows of text
    (names are data, not markup)."""
    for index, column in enumerate(columns):
        table.add_column(_HEADERS.get(column, column), justify="right" if column in right else "left", no_wrap=column not in wrapped,
                         overflow="fold", min_width=_longest_word([row[index] for row in cells]) if column in wrapped else None)
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _longest_word(cells: list[str]) -> int | None:
    """The widest word of a wrapped column's cells: its least width, so rich wraps between words, never inside one."""
    words = [len(word) for cell in cells for word in cell.replace(",", " ").split()]
    return min(max(words), 40) if words else None


_HEADERS = {"runner_up": "runner-up", "trial_id": "id", "lookback": "lb", "attempts": "try", "duration_s": "secs", "config_id": "config", "chosen_on": "by", **{f"val_{m}": f"val {m}" for m in METRICS},
            **{f"vs_{family}": f"vs {family}" for family in REFERENCES}}


def _varying_settings(train: Any) -> list[str]:
    """Per row, the train settings that differ between the rows shown (the same everywhere: not repeated)."""
    import json

    cache: dict[str, dict[str, Any]] = {}
    parsed = [cache[text] if text in cache else cache.setdefault(text, json.loads(text)) for text in train]
    keys = sorted({key for settings in parsed for key in settings})
    # Among the rows that have a setting (classical models have none): does its value differ?
    varying = [key for key in keys if len({json.dumps(settings[key], sort_keys=True) for settings in parsed if key in settings}) > 1]
    return [", ".join(f"{key}={_rounded(settings[key])}" for key in varying if key in settings) for settings in parsed]


def _rounded(value: Any) -> str:
    """A setting as a reader takes it in: a float to 3 significant digits (a search's sampled lr 0.0029082010120819336
    reads 0.00291; the full value stays in --format csv/json)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _cell(column: str, value: Any) -> str:
    """A value as the table shows it: text a terminal prints as it is (control characters as their escapes)."""
    return visible(_shown(column, value))


def _shown(column: str, value: Any) -> str:
    if value is None or value != value:  # None or NaN
        return ""
    if column in ("trial_id", "config_id"):
        return str(value)[:8]
    if column == "stale":
        return "stale" if value else ""
    if column == "params":
        import json

        parsed = json.loads(value) if isinstance(value, str) and value.startswith("{") else None
        if isinstance(parsed, dict):
            return ", ".join(f"{key}:{_rounded(item) if not isinstance(item, (list, dict)) else json.dumps(item)}" for key, item in parsed.items())
        return str(value).replace('"', "").replace(",", ", ").strip("{}")
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def ensemble_table(rows: list[dict[str, Any]], max_rows: int = TABLE_ROWS) -> Table:
    """`results --ensemble`: per configuration and project, the ensemble against its members."""
    how = rows[0]["ensemble"] if rows else "median"
    table = Table(title=f"{how} ensembles of each configuration's seeds, per project (test metrics)", title_justify="left", pad_edge=False, box=None,
                  header_style="bold")
    columns = ("project", "family", "params", "lookback", "members", "mae", "member_mae_mean", "member_mae_best", "smape", "mase")
    headers = {"lookback": "lb", "member_mae_mean": "members' mae", "member_mae_best": "best member"}
    for column in columns:
        table.add_column(headers.get(column, column), justify="left" if column in ("project", "family", "params") else "right")
    for row in rows[:max_rows]:
        table.add_row(*(Text(_cell(name, row.get(name))) for name in columns))
    return table


def estimate_table(estimate: dict[str, Any]) -> Table:
    low, high = estimate["range_seconds"]
    ranged = any("range_per_trial" in shape for shape in estimate["shapes"])
    where = (f"; early stopping decides between {_duration(low)} and {_duration(high)}: the figures are the geometric middle of the fewest "
             "and most epochs it allows") if ranged else ""
    table = Table(title=f"estimate (sampling took {estimate['sampling_s']:.0f} s{where})", title_justify="left")
    for column in ("lane", "trials", "slots x threads", "device", "wall time"):
        table.add_column(column, justify="left" if column in ("lane", "device") else "right")
    for name, lane in estimate["lanes"].items():
        table.add_row(name, str(lane["trials"]), f"{lane['slots']} x {lane['threads']}", Text(visible(lane["device"])), _duration(lane["seconds"]))
    table.add_row("start-up", "", "", "workers' imports, data", _duration(estimate.get("startup_seconds", 0.0)), style="dim")
    table.add_row("campaign", str(sum(lane["trials"] for lane in estimate["lanes"].values())), "", "lanes run at once", _duration(estimate["total_seconds"]), style="bold")
    for family, numbers in estimate["families"].items():
        table.add_row(Text(visible(f"  {family}")), str(numbers["trials"]), "", "trial-time", _duration(numbers["trial_seconds"]), style="dim")
    return table
