"""Campaign commands: run, demo, status, results, estimate, monitor, report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from gpufill.cli.app import app
from gpufill.cli.options import (
    parse_slots,
)
from gpufill.errors import InputError, visible


@app.command()
def run(
    campaign: Path = typer.Argument(..., help="Campaign YAML file."),
    workdir: Path | None = typer.Option(None, "--workdir", help="Where the store, logs and checkpoints live (default ./gpufill-NAME)."),
    gpu_slots: str | None = typer.Option(None, "--gpu-slots", help="N or auto (overrides the file's resources)."),
    cpu_slots: str | None = typer.Option(None, "--cpu-slots", help="N or auto (overrides the file's resources)."),
    executor: str = typer.Option("local", "--executor", help="local (processes here), inline (in this process, one trial at a time: for a debugger), ray (gpufill[ray]) or slurm (gpufill[slurm], resources.slurm)."),
    address: str | None = typer.Option(None, "--address", help="With --executor ray: the cluster to join (e.g. auto, HOST:6379); default a local Ray."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over: delete this workdir's store and run logs first (nothing else in it)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before --fresh deletes results."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every trial (WORKDIR/logs/run-N.log)."),
    mlflow: str | None = typer.Option(None, "--mlflow", help="Copy finished trials to this MLflow tracking URI as they finish (gpufill[mlflow]); "
                                                             "overrides the file's tracking.mlflow."),
) -> None:
    """Run a campaign; running it again resumes (done trials are kept)."""
    _run_campaign(campaign, workdir, gpu_slots, cpu_slots, executor, fresh, yes, command="gpufill run", verbose=verbose, address=address, mlflow=mlflow)


def _run_campaign(campaign: Path, workdir: Path | None, gpu_slots: str | None, cpu_slots: str | None, executor: str, fresh: bool, yes: bool, command: str,
                  verbose: bool = False, address: str | None = None, mlflow: str | None = None) -> None:
    from rich.live import Live
    from rich.markup import escape

    from gpufill.cli import campaign_tables
    from gpufill.campaign.executors import check_executor
    from gpufill.campaign.store.lock import check_free
    from gpufill.campaign.run.stopping import RunInterrupted
    from gpufill.campaign.run.runner import Campaign, describe_lanes, describe_timeout

    check_executor(executor, address)  # before the file is read or --fresh asks anything
    job = Campaign.from_yaml(campaign, workdir)
    check_free(job.workdir)  # a live run's workdir: refused before --fresh asks to delete it
    if fresh and (job.workdir / "gpufill.db").exists() and not yes:
        if not sys.stdin.isatty():
            raise InputError("--fresh would delete this workdir's results", where=str(job.workdir), field="--fresh", fix="add --yes to confirm")
        typer.confirm(f"Delete the results in {job.workdir} and start over?", abort=True)
    console = Console()
    live = Live(console=console, refresh_per_second=4, transient=False)

    def on_start(prepared, run_id) -> None:
        for warning in prepared.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(visible(warning))}")
        for lane in describe_lanes(prepared.lanes):
            console.print(visible(f"lane {lane['lane']}: {lane['slots']} slots x {lane['threads']} threads on {lane['device']} ({', '.join(lane['runs'])}): "
                                  f"{lane['reason']}"), markup=False)
        console.print(f"trial timeout: {describe_timeout(job.spec.resources)}", markup=False)
        search = job.spec.search
        listed = _trials_line(len(prepared.trials), job.status().total)
        if search is not None:  # its trials are listed a round at a time
            listed = (f"search: {search.sampler} sampler, {search.trials} configurations in rounds of {search.batch}, chosen on {job.spec.search_metric}; "
                      f"{listed} listed so far")
        console.print(visible(f"{listed}; workdir {job.workdir}"), markup=False)
        live.start()

    try:
        outcome = job.run(gpu_slots=parse_slots(gpu_slots, "--gpu-slots"), cpu_slots=parse_slots(cpu_slots, "--cpu-slots"), fresh=fresh,
                          command=command, verbose=verbose, executor=executor, address=address, on_start=on_start,
                          on_update=lambda snapshot: live.update(campaign_tables.campaign_view(snapshot, job.spec.name)), mlflow=mlflow)
    except RunInterrupted as stopped:
        live.stop()
        print(f"gpufill: {stopped.one_line(job.resume_command(command))}", file=sys.stderr)
        raise typer.Exit(stopped.exit_code) from None
    finally:
        live.stop()
        if not console.is_terminal:  # rich leaves the last frame without a newline when piped
            console.print()
    counts = job.status().to_dict()
    environment = f", {outcome.environment} environment failures retried without using an attempt" if outcome.environment else ""
    pruned = f", pruned {counts['pruned']}" if counts.get("pruned") else ""  # a search's pruner stopped them: finished, never ranked
    console.print(f"done {counts['done']}{pruned}, failed {counts['failed']}, pending {counts['pending']} of {counts['total']} trials in {outcome.elapsed_s:.1f} s"
                  f" ({outcome.retried} retried{environment}, {outcome.crashed} worker crashes). Results: gpufill results --workdir {job.workdir}", markup=False)
    if outcome.tracking:
        console.print(visible(outcome.tracking), markup=False, soft_wrap=True)  # one line, whole: it holds a command to copy
    if outcome.waiting:  # the campaign is not finished: say why and what finishes it
        print(visible(f"gpufill: {outcome.waiting} trials are left pending because the environment kept failing them (last: {outcome.waiting_reason}); "
                      f"they used none of their retries: once that is fixed, finish the campaign with: {job.resume_command(command)}"), file=sys.stderr)
    if counts["failed"] or outcome.waiting:
        raise typer.Exit(1)


def _trials_line(trials: int, counts: dict[str, int]) -> str:
    """The campaign's trials and, on a re-run, what is done already and what this run does."""
    done, pending = counts.get("done", 0), counts.get("pending", 0)
    if not done:
        return f"{trials} trials"
    failed = f", {counts['failed']} failed" if counts.get("failed") else ""
    return f"{trials} trials: {done} done{failed}, " + ("nothing to run" if not pending else f"{pending} to run")


@app.command()
def demo(
    workdir: Path = typer.Option(Path("gpufill-demo"), "--workdir"),
    fresh: bool = typer.Option(False, "--fresh"),
    yes: bool = typer.Option(False, "--yes", "-y"),
) -> None:
    """Run the bundled example campaign (all 8 families, a few minutes on 2 CPU cores)."""
    from gpufill.campaign.run.runner import demo_campaign_path

    _run_campaign(demo_campaign_path(), workdir, None, None, "local", fresh, yes, command="gpufill demo")


@app.command()
def status(
    workdir: Path | None = typer.Option(None, "--workdir"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Trial counts per status, overall and per lane; Slurm jobs queued or running."""
    from gpufill.cli import campaign_tables
    from gpufill.campaign.results.reading import find_workdir, read_jobs, read_status

    directory = find_workdir(workdir)
    counts = read_status(directory).to_dict()
    jobs = read_jobs(directory)
    if jobs:
        counts["jobs"] = [{"job_id": j["job_id"], "state": j["state"], "detail": j["detail"], "lane": j["lane"], "trials": len(j["trial_ids"])} for j in jobs]
    if as_json:
        print(json.dumps(counts))
        return
    console = Console()
    console.print(campaign_tables.status_table(counts))
    if counts["run"] and counts["run"]["state"] == "interrupted":
        from gpufill.campaign.results.reading import stopped_line

        console.print(visible(stopped_line(counts["run"], counts["interrupted"])), markup=False, soft_wrap=True)  # the resume command stays whole
    if counts["stale"]:
        console.print(f"{counts['stale']} finished trials of an earlier version of the file or data are kept, not counted: "
                      f"gpufill results --all --workdir {directory}", markup=False)
    for state in ("queued", "running"):
        ids = [j["job_id"] for j in jobs if j["state"] == state]
        if ids:
            console.print(visible(f"Slurm jobs {state}: {len(ids)} ({', '.join(ids[:20])}{', ...' if len(ids) > 20 else ''})"), markup=False)


OFF_TERMINAL_WIDTH = 1000
"""Columns a table gets when stdout is not a terminal (a pipe, a file): wide enough that no column is cut (rich
would take 80, printing `projec famil see`), so `gpufill results > table.txt` keeps every value whole."""


def _table_console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=OFF_TERMINAL_WIDTH)


@app.command()
def results(
    workdir: Path | None = typer.Option(None, "--workdir"),
    format_: str = typer.Option("table", "--format", help="table, csv, parquet or json."),
    out: Path | None = typer.Option(None, "--out", help="Write to this file instead of stdout (parquet needs it)."),
    summary: bool = typer.Option(False, "--summary", help="Best configuration per project and family."),
    best: bool = typer.Option(False, "--best", help="Best configuration per project across families: one row per project, with the runner-up."),
    all_: bool = typer.Option(False, "--all", help="Also the trials of earlier versions of the file or data (stale), with what differs."),
    forecasts: bool = typer.Option(False, "--forecasts", help="The stored test forecasts: one row per trial, project, test window and step (with the actual value)."),
    ensemble: str | None = typer.Option(None, "--ensemble", help="median or mean: combine the forecasts of every seed of a configuration per project, and score that."),
    ensemble_over: str = typer.Option("seed", "--ensemble-over", help="seed, or seed,lookback: what the ensemble's members may differ in."),
    window: str = typer.Option("test", "--window", help="With --forecasts: test, or val (each trial's forecasts of the validation windows, by a model that never trained on their targets)."),
) -> None:
    """One row per trial of the campaign file as it is now (or, with --summary, the best configuration per project and family)."""
    from gpufill.cli import campaign_tables
    from gpufill.campaign.results import reading

    if format_ not in ("table", "csv", "parquet", "json"):
        raise InputError(f"unknown format {format_!r}", where="command line", field="--format", fix="use table, csv, parquet or json")
    directory = reading.find_workdir(workdir)
    if window not in ("test", "val") or (window == "val" and not forecasts):
        raise InputError(f"--window {window} is not a view of the forecasts", where="command line", field="--window",
                         fix="use --forecasts --window val (or test, the default)")
    if forecasts or ensemble is not None:
        _forecast_views(directory, forecasts=forecasts, ensemble=ensemble, over=tuple(ensemble_over.split(",")), format_=format_, out=out, window=window)
        return
    metric = reading.campaign_metric(directory)  # the campaign's task.metric: what --best and --summary rank by
    if best:
        rows = reading.winners(reading.read_best(directory, metric=metric), metric)
        if format_ == "table" and out is None:
            _table_console().print(campaign_tables.winners_table(rows, metric))
            return
        import pandas as pd

        from gpufill.campaign.results.export import write_frame

        write_frame(pd.DataFrame.from_records(rows), "csv" if format_ == "table" else format_, out)
        return
    if format_ == "table" and out is None:  # plain SQLite, no pandas: answers in well under a second from 36,000 trials
        if summary:
            rows = reading.read_best(directory, include_stale=all_, metric=metric)
            total = len(rows)
        else:
            rows, total = reading.read_trial_records(directory, include_stale=all_, limit=None if all_ else campaign_tables.TABLE_ROWS)
        _table_console().print(campaign_tables.results_table(rows, summary=summary, total=total, stale_view=all_, metric=metric))
        return
    import pandas as pd

    from gpufill.campaign.results.export import write_frame

    if summary:  # the table's rows, declared ensemble included: the same reader, the same numbers
        frame = pd.DataFrame.from_records(reading.read_best(directory, include_stale=all_, metric=metric), columns=reading.summary_columns(metric, stale=all_))
    else:
        frame = reading.read_trials(directory, include_stale=all_)
    write_frame(frame, "csv" if format_ == "table" else format_, out)


def _forecast_views(directory: Path, *, forecasts: bool, ensemble: str | None, over: tuple[str, ...], format_: str, out: Path | None,
                    window: str = "test") -> None:
    import pandas as pd

    from gpufill.campaign.results.ensembles import ensembles, forecast_rows
    from gpufill.campaign.results.export import write_frame
    from gpufill.cli import campaign_tables

    if forecasts and ensemble is not None:
        raise InputError("--forecasts and --ensemble are two views", where="command line", field="--ensemble", fix="ask for one of them")
    rows = forecast_rows(directory, window=window) if forecasts else ensembles(directory, ensemble, over=over)  # type: ignore[arg-type]
    if format_ == "table" and out is None:
        if forecasts:  # long: thousands of rows; the table view would be useless
            raise InputError("--forecasts is a long table", where="command line", field="--format", fix="add --format csv (or parquet with --out)")
        Console().print(campaign_tables.ensemble_table(rows))
        return
    write_frame(pd.DataFrame.from_records(rows), "csv" if format_ == "table" else format_, out)


@app.command()
def estimate(
    campaign: Path = typer.Argument(..., help="Campaign YAML file."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Predict a campaign's time per lane by timing a sample of each trial shape."""
    from gpufill.cli import campaign_tables
    from gpufill.campaign.run.estimate import estimate as run_estimate
    from gpufill.campaign.run.runner import Campaign

    console = Console(stderr=as_json)
    with console.status("timing a sample of each trial shape") as spinner:
        result = run_estimate(Campaign.from_yaml(campaign), progress=lambda text: spinner.update(f"timing {text}"))
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        console.print(campaign_tables.estimate_table(result.to_dict()))


@app.command()
def monitor(
    workdir: Path | None = typer.Option(None, "--workdir"),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Render once and exit (for scripts and logs)."),
) -> None:
    """Live dashboard of a running (or finished) campaign: lanes, rate, ETA, GPU and CPU sparklines."""
    import time

    from rich.live import Live

    from gpufill.campaign.results.reading import find_workdir
    from gpufill.cli import live as dashboard

    directory = find_workdir(workdir)
    console = Console()
    if once:
        console.print(dashboard.render(dashboard.snapshot(directory)))
        return
    with Live(dashboard.render(dashboard.snapshot(directory)), console=console, refresh_per_second=4, screen=False) as view:
        try:
            while True:
                time.sleep(interval)
                view.update(dashboard.render(dashboard.snapshot(directory)))
        except KeyboardInterrupt:
            return


@app.command()
def report(
    workdir: Path | None = typer.Option(None, "--workdir"),
    out: Path | None = typer.Option(None, "--out", help="HTML file to write (default WORKDIR/report.html)."),
    grid: Path | None = typer.Option(None, "--grid", help="A search's report only: the workdir of the same campaign run as a full grid, "
                                                          "its course drawn beside the search's."),
) -> None:
    """Write one self-contained HTML report: summary, model comparison, resources, failures, alerts, plans."""
    from gpufill.campaign.results.reading import find_workdir
    from gpufill.report import write_report

    print(write_report(find_workdir(workdir), out, grid=grid))


