"""Rich rendering shared by the commands: plans with reasons, epoch progress, metric tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gpufill.fit import EpochCallback, EpochRecord
from gpufill.forecast import ForecastRun
from gpufill.plan import Plan


def plan_table(plan: Plan) -> Table:
    table = Table(title="Plan", title_justify="left", show_lines=False)
    table.add_column("setting", style="bold")
    table.add_column("value")
    table.add_column("reason", style="dim", overflow="fold")
    for name, choice in plan.to_dict().items():
        table.add_row(name, _short(choice["value"]), choice["reason"])
    return table


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "-" if value is None else str(value)


@contextlib.contextmanager
def epoch_progress(console: Console, epochs: int, *, enabled: bool = True) -> Iterator[EpochCallback]:
    """A progress bar over epochs; yields the callback fit() calls after each epoch."""
    if not enabled:
        yield lambda record: None
        return
    progress = Progress(
        TextColumn("[bold]epoch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[losses]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task("train", total=epochs, losses="")

        def on_epoch(record: EpochRecord) -> None:
            losses = f"train {record.train_loss:.4g}" + (f"  val {record.val_loss:.4g}" if record.val_loss is not None else "")
            progress.update(task, completed=record.epoch, losses=losses)

        yield on_epoch


def print_forecast(run: ForecastRun, console: Console) -> None:
    console.print(plan_table(run.fit.plan))
    table = Table(title=f"{run.family} on {run.project}: test metrics (original scale)", title_justify="left")
    table.add_column("forecast", style="bold")
    for key in ("mae", "rmse", "smape", "mase"):
        table.add_column(key, justify="right")
    for name, metrics in ((run.family, run.test), ("naive (last value)", run.naive)):
        table.add_row(name, *(f"{metrics[key]:.4g}" for key in ("mae", "rmse", "smape", "mase")))
    console.print(table)
    timings = run.fit.timings
    verdict = "beats" if run.beats_naive else "does NOT beat"
    console.print(
        f"{run.family} {verdict} the naive forecast (MAE {run.test['mae']:.4g} vs {run.naive['mae']:.4g}); "
        f"{timings['samples_per_s']:,.0f} samples/s, {timings['epoch_s']:.3g} s/epoch; status {run.fit.status}"
    )
    for event in run.fit.events:
        console.print(f"  - {event}", style="dim")
