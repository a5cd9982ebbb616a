"""`gpufill forecast`: each project's next values with intervals, from what its campaign chose (campaign/future/)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufill.cli.app import app
from gpufill.errors import InputError


def parse_levels(value: str) -> list[float]:
    """"80,95" -> [80.0, 95.0]: interval levels in percent, each in (0, 100)."""
    try:
        levels = [float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or not all(0 < level < 100 for level in levels):
        raise InputError(f"expected levels in percent between 0 and 100, got {value!r}", where="command line", field="--level", fix="pass e.g. --level 80,95")
    return sorted(set(levels))


@app.command("forecast")
def forecast_command(
    workdir: Path | None = typer.Option(None, "--workdir", help="The campaign's workdir (default: the one here)."),
    horizon: int | None = typer.Option(None, "--horizon", help="Steps after the data's end (default and most: the campaign's task.horizon)."),
    level: str = typer.Option("80,95", "--level", help="Interval levels in percent, split conformal from the validation windows' errors."),
    from_: str = typer.Option("auto", "--from", help="ensemble (the declared ensemble), best (each project's best configuration, its seeds' median) or auto (ensemble where declared)."),
    data: str | None = typer.Option(None, "--data", help="Forecast these values (a source like the file's data.source: newer data, say) with the campaign's choices."),
    out: Path | None = typer.Option(None, "--out", help="Write the rows here: .csv or .parquet (default WORKDIR/forecast.csv)."),
) -> None:
    """Forecast past the end of the data: what the campaign chose, trained on all of it (the refit's length), one row per
    project and step with the point forecast and each interval; forecasting again retrains nothing."""
    from gpufill.campaign.future.choice import FROM
    from gpufill.campaign.future.forecast import forecast, write
    from gpufill.campaign.results.reading import find_workdir

    if from_ not in FROM:
        raise InputError(f"unknown --from {from_!r}", where="command line", field="--from", fix=f"use one of {', '.join(FROM)}")
    levels = parse_levels(level)
    directory = find_workdir(workdir)
    target = out if out is not None else directory / "forecast.csv"
    if target.suffix not in (".csv", ".parquet"):  # before anything trains
        raise InputError(f"{target.name}: a forecast is written as .csv or .parquet", where=str(target), field="--out", fix="name the file F.csv or F.parquet")
    done = forecast(directory, horizon=horizon, levels=levels, how=from_, data=data)  # type: ignore[arg-type]
    path = write(done.frame, target)
    for note in done.notes:
        print(f"note: {note}")
    projects = done.frame["project"].nunique() if len(done.frame) else 0
    steps = int(done.frame["step"].max()) if len(done.frame) else 0
    print(f"forecast: {projects} project(s) x {steps} step(s), intervals at {', '.join(f'{x:g}' for x in levels)} % -> {path} "
          f"({done.trained} trained on all the data now, {done.reused} read back from {directory / 'future'})")
    said = [f"{level:g} % covered {100 * score['coverage']:.1f} % (MSIS {score['msis']:.3g})" if score["coverage"] is not None
            else f"{level:g} %: too few validation windows to bound it" for level, score in done.held_out.items()]
    if said:
        print(f"the same intervals on the campaign's test windows (not used to calibrate them): {'; '.join(said)}")
