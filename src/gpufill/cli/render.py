"""Rich rendering shared by the commands: plans with reasons, epoch progress, metric tables."""

from __future__ import annotations

import json
from typing import IO, Any

from rich.console import Console
from rich.progress import TaskID, BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.markup import escape
from rich.text import Text

from gpufill.engine.result import EpochRecord, FitCallback
from gpufill.engine.plan import Plan
from gpufill.errors import visible
from gpufill.forecasting.metric_registry import METRICS


def plan_table(plan: Plan | dict[str, dict[str, Any]]) -> Table:
    """A Plan, or its to_dict() form (classical trainings have a small plan of their own)."""
    table = Table(title="Plan", title_justify="left", show_lines=False)
    table.add_column("setting", style="bold")
    table.add_column("value")
    table.add_column("reason", style="dim", overflow="fold")
    for name, choice in (plan if isinstance(plan, dict) else plan.to_dict()).items():
        table.add_row(name, Text(visible(_short(choice["value"]))), Text(visible(choice["reason"])))  # reasons quote user names: text, not markup
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


class JsonProgress(FitCallback):
    """`--json`'s progress: one JSON object per line on stderr (stdout keeps the result alone) as things happen:
    each recorded event (the probe's measured settings and cost), the plan once final, each epoch's losses."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def say(self, **fields: Any) -> None:
        self.stream.write(json.dumps(fields, default=str) + "\n")
        self.stream.flush()

    def on_event(self, text: str) -> None:
        self.say(event=text)

    def on_fit_start(self, plan: Plan, epochs: int) -> None:
        self.say(plan={name: choice["value"] for name, choice in plan.to_dict().items()}, epochs=epochs)

    def on_epoch_end(self, record: EpochRecord) -> None:
        self.say(epoch=record.epoch, train_loss=record.train_loss, val_loss=record.val_loss, seconds=round(record.seconds, 4))


def print_forecast(outcome: dict[str, Any], console: Console) -> None:
    """Test metrics next to the naive forecast, speed, and what happened (any trained forecaster's to_dict())."""
    if not outcome["history"]:  # neural trainings showed their plan when training started
        console.print(plan_table(outcome["plan"]))
    test, naive = outcome["metrics"]["test"], outcome["metrics"]["naive"]
    family = visible(outcome["family"])  # names are data: shown as text, never markup or terminal codes
    table = Table(title=escape(f"{family} on {visible(outcome['project'])}: test metrics (original scale)"), title_justify="left")
    table.add_column("forecast", style="bold")
    for key in METRICS:
        table.add_column(key, justify="right")
    for name, metrics in ((family, test), ("naive (last value)", naive)):
        table.add_row(Text(name), *(f"{metrics[key]:.4g}" for key in METRICS))
    console.print(table)
    timings = outcome["timings"]
    verdict = "beats" if test["mae"] < naive["mae"] else "does NOT beat"
    speed = f"{timings['samples_per_s']:,.0f} samples/s" + (f", {timings['epoch_s']:.3g} s/epoch" if "epoch_s" in timings else "")
    console.print(f"{family} {verdict} the naive forecast (MAE {test['mae']:.4g} vs {naive['mae']:.4g}); {speed}; status {outcome['status']}", markup=False)
    for event in outcome["events"]:
        console.print(f"  - {visible(event)}", style="dim", markup=False)
