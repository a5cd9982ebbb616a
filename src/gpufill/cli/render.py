"""Rich rendering shared by the commands: plans with reasons, epoch progress, metric tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import TaskID, BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from gpufill.engine.result import EpochRecord, FitCallback
from gpufill.engine.plan import Plan


def plan_table(plan: Plan | dict[str, dict[str, Any]]) -> Table:
    """A Plan, or its to_dict() form (classical trainings have a small plan of their own)."""
    table = Table(title="Plan", title_justify="left", show_lines=False)
    table.add_column("setting", style="bold")
    table.add_column("value")
    table.add_column("reason", style="dim", overflow="fold")
    for name, choice in (plan if isinstance(plan, dict) else plan.to_dict()).items():
        table.add_row(name, Text(_short(choice["value"])), Text(str(choice["reason"])))  # reasons quote user names: not markup
    return table


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "-" if value is None else str(value)


class EpochProgress(FitCallback):
    """Prints the plan when training starts, then a progress bar over epochs."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]epoch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[losses]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.task: TaskID | None = None

    def on_fit_start(self, plan: Plan, epochs: int) -> None:
        self.console.print(plan_table(plan))
        self.task = self.progress.add_task("train", total=epochs, losses="")
        self.progress.start()

    def on_epoch_end(self, record: EpochRecord) -> None:
        losses = f"train {record.train_loss:.4g}" + (f"  val {record.val_loss:.4g}" if record.val_loss is not None else "")
        assert self.task is not None
        self.progress.update(self.task, completed=record.epoch, losses=losses)

    def __enter__(self) -> EpochProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:  # never started (bad input before the plan): print nothing
            self.progress.stop()


def print_forecast(outcome: dict[str, Any], console: Console) -> None:
    """Test metrics next to the naive forecast, speed, and what happened (any trained forecaster's to_dict())."""
    if not outcome["history"]:  # neural trainings showed their plan when training started
        console.print(plan_table(outcome["plan"]))
    test, naive = outcome["metrics"]["test"], outcome["metrics"]["naive"]
    family = outcome["family"]
    table = Table(title=f"{family} on {outcome['project']}: test metrics (original scale)", title_justify="left")
    table.add_column("forecast", style="bold")
    for key in ("mae", "rmse", "smape", "mase"):
        table.add_column(key, justify="right")
    for name, metrics in ((family, test), ("naive (last value)", naive)):
        table.add_row(name, *(f"{metrics[key]:.4g}" for key in ("mae", "rmse", "smape", "mase")))
    console.print(table)
    timings = outcome["timings"]
    verdict = "beats" if test["mae"] < naive["mae"] else "does NOT beat"
    speed = f"{timings['samples_per_s']:,.0f} samples/s" + (f", {timings['epoch_s']:.3g} s/epoch" if "epoch_s" in timings else "")
    console.print(f"{family} {verdict} the naive forecast (MAE {test['mae']:.4g} vs {naive['mae']:.4g}); {speed}; status {outcome['status']}")
    for event in outcome["events"]:
        console.print(f"  - {event}", style="dim")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def campaign_view(snapshot: Any, title: str = "campaign") -> Table:
    """Per-lane progress, rate and ETA, and the trials running now (fits 80 columns)."""
    table = Table(title=f"{escape(title)}  {_duration(snapshot.elapsed_s)} elapsed  {snapshot.trials_per_min:.1f} trials/min", title_justify="left")
    table.add_column("lane", style="bold")
    table.add_column("progress")
    table.add_column("done", justify="right")
    table.add_column("fail", justify="right")
    table.add_column("run", justify="right")
    table.add_column("wait", justify="right")
    table.add_column("ETA", justify="right")
    for name, lane in snapshot.lanes.items():
        total = max(lane.total, 1)
        filled = int(16 * (lane.done + lane.failed) / total)
        bar = "[green]" + "█" * filled + "[/green]" + "░" * (16 - filled)
        table.add_row(f"{name} ({lane.slots}x{lane.threads}t)", bar, str(lane.done), str(lane.failed), str(lane.running), str(lane.pending), _duration(snapshot.eta_s(name)))
    for trial in snapshot.running[:6]:
        table.add_row("", Text(f"{trial['family']} {trial['project']}", style="dim"), "", "", f"[dim]{trial['seconds']:.0f}s[/dim]", "", "")
    return table


def status_table(counts: dict[str, Any]) -> Table:
    table = Table(title="trials", title_justify="left")
    columns = ("total", "pending", "running", "done", "failed", "skipped")
    table.add_column("lane", style="bold")
    for column in columns:
        table.add_column(column, justify="right")
    for lane, lane_counts in counts["lanes"].items():
        table.add_row(lane, *(str(lane_counts.get(c, 0)) for c in columns))
    table.add_row("all", *(str(counts[c]) for c in columns), style="bold")
    return table


# The table view shows what a reader scans; csv/json/parquet keep every column.
_TRIAL_COLUMNS = ("trial_id", "project", "family", "params", "seed", "lookback", "status", "attempts", "lane", "duration_s", "mae", "rmse", "smape", "mase")


def results_table(frame: Any, *, summary: bool, max_rows: int = 500) -> Table:
    columns = [c for c in frame.columns] if summary else [c for c in _TRIAL_COLUMNS if c in frame.columns]
    title = "best configuration per project and family (mean over seeds)" if summary else f"{len(frame)} trials"
    if len(frame) > max_rows:
        title += f" (first {max_rows}; --format csv for all)"
    table = Table(title=title, title_justify="left", pad_edge=False, box=None, header_style="bold")
    for column in columns:
        table.add_column(
            _HEADERS.get(column, column),
            justify="right" if frame[column].dtype.kind in "if" else "left",
            no_wrap=column != "params",
            overflow="fold",
        )
    for row in frame[columns].head(max_rows).itertuples(index=False):
        table.add_row(*(Text(_cell(name, value)) for name, value in zip(columns, row, strict=True)))  # names are data, not markup
    return table


_HEADERS = {"trial_id": "id", "lookback": "lb", "attempts": "try", "duration_s": "secs"}


def _cell(column: str, value: Any) -> str:
    if value is None or value != value:  # None or NaN
        return ""
    if column == "trial_id":
        return str(value)[:8]
    if column == "params":
        return str(value).replace('"', "").replace(",", ", ").strip("{}")
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def estimate_table(estimate: dict[str, Any]) -> Table:
    table = Table(title=f"estimate (sampling took {estimate['sampling_s']:.0f} s; neural figures are upper bounds: early stopping ends trials sooner)", title_justify="left")
    for column in ("lane", "trials", "slots x threads", "device", "wall time"):
        table.add_column(column, justify="left" if column in ("lane", "device") else "right")
    for name, lane in estimate["lanes"].items():
        table.add_row(name, str(lane["trials"]), f"{lane['slots']} x {lane['threads']}", lane["device"], _duration(lane["seconds"]))
    table.add_row("campaign", str(sum(lane["trials"] for lane in estimate["lanes"].values())), "", "lanes run at once", _duration(estimate["total_seconds"]), style="bold")
    for family, numbers in estimate["families"].items():
        table.add_row(f"  {family}", str(numbers["trials"]), "", "trial-time", _duration(numbers["trial_seconds"]), style="dim")
    return table
