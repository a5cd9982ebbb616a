"""The gpufill command line: parse, call the library, print. Exit 0 ok, 1 failed run, 2 bad input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.console import Console

from gpufill import __version__
from gpufill.errors import InputError

app = typer.Typer(
    name="gpufill",
    help="Run deep-learning experiment campaigns at the speed of the hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)


def parse_auto_int(value: str, option: str) -> int | str:
    """"auto" or a positive integer."""
    if value == "auto":
        return "auto"
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise InputError(f"expected a positive integer or auto, got {value!r}", where="command line", field=option, fix=f"pass e.g. {option} 128 or {option} auto")
    return number


def parse_switch(value: str, option: str) -> bool | str:
    """"auto", "on" or "off"."""
    choices = {"auto": "auto", "on": True, "off": False, "true": True, "false": False}
    if value.lower() not in choices:
        raise InputError(f"expected auto, on or off, got {value!r}", where="command line", field=option, fix=f"pass {option} auto|on|off")
    return choices[value.lower()]


def parse_split_size(value: str, option: str) -> float | int:
    """A fraction in [0, 1) such as 0.2, or a count of final time steps such as 18."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0 or (number >= 1 and not number.is_integer()):
        raise InputError(f"expected a fraction in [0, 1) or a whole count of time steps, got {value!r}", where="command line", field=option, fix=f"pass e.g. {option} 0.2 or {option} 18")
    return int(number) if number >= 1 else number


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; values are read as YAML scalars (128 -> int, 1e-3 -> float, true -> bool)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InputError(f"expected KEY=VALUE, got {pair!r}", where="command line", field="--param", fix="pass e.g. --param hidden_size=128")
        params[key.strip()] = yaml.safe_load(raw)
    return params


@app.command()
def train(
    model: str = typer.Option(..., "--model", "-m", help="Model family (lstm, gru, tcn, transformer, mlp, linear, rf, xgb, lgbm) or package.module:factory."),
    data: str = typer.Option("synthetic", "--data", help="synthetic, a .csv/.parquet file, a directory or a glob."),
    project: Optional[str] = typer.Option(None, "--project", help="Project to train on (default: the first one)."),
    lookback: int = typer.Option(30, "--lookback", help="Input window length."),
    horizon: int = typer.Option(1, "--horizon", help="Steps to forecast."),
    epochs: int = typer.Option(10, "--epochs"),
    batch_size: str = typer.Option("auto", "--batch-size", help="Effective batch, or auto."),
    precision: str = typer.Option("auto", "--precision", help="auto, bf16, fp16 or fp32."),
    compile_: str = typer.Option("auto", "--compile", help="auto, on or off."),
    batch_search: str = typer.Option("auto", "--batch-search", help="auto, on or off: measure micro-batch sizes, keep the fastest."),
    allow_batch_change: bool = typer.Option(False, "--allow-batch-change", help="Let the batch search change the effective batch (lr scaled by --lr-scale)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    lr: float = typer.Option(1e-3, "--lr", help="Learning rate at the reference batch (128)."),
    lr_scale_rule: str = typer.Option("linear", "--lr-scale", help="linear, sqrt or none: how lr follows the batch."),
    patience: Optional[int] = typer.Option(None, "--patience", help="Early stopping patience (validations)."),
    seed: int = typer.Option(0, "--seed"),
    param: list[str] = typer.Option([], "--param", "-p", help="Model parameter KEY=VALUE (repeatable)."),
    val: str = typer.Option("0.1", "--val", help="Validation split: fraction or count of final steps."),
    test: str = typer.Option("0.2", "--test", help="Test split: fraction or count of final steps (e.g. 18)."),
    target: str = typer.Option("target", "--target", help="Target column (csv/parquet)."),
    project_column: str = typer.Option("project", "--project-column", help="Project column (csv/parquet)."),
    time_column: Optional[str] = typer.Option(None, "--time-column", help="Time column (default: time/date/timestamp if present)."),
    fill: str = typer.Option("none", "--fill", help="NaN handling: none (error), ffill, interpolate or zero."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Save a checkpoint every epoch here."),
    resume: bool = typer.Option(False, "--resume", help="Continue from --checkpoint-dir's last checkpoint."),
    nproc: int = typer.Option(1, "--nproc", help="Processes for data-parallel training (DDP through torchrun): one per GPU, or CPU processes on gloo."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Train one forecaster on one project, with the plan explained and metrics against the naive forecast."""
    if nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {nproc}", where="command line", field="--nproc", fix="pass e.g. --nproc 2")
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(_launch_torchrun(nproc))
    quiet = int(os.environ.get("RANK", "0")) != 0  # under DDP rank 0 reports for all
    from gpufill import forecast, render  # torch is imported only when a command runs
    from gpufill.data import Split
    from gpufill.fit import FitConfig
    from gpufill.models import registry

    params = parse_params(param)
    config = FitConfig(
        epochs=epochs,
        lr=lr,
        patience=patience,
        seed=seed,
        device=device,
        precision=precision,  # type: ignore[arg-type]  # checked by the plan
        compile=parse_switch(compile_, "--compile"),
        batch_search=parse_switch(batch_search, "--batch-search"),
        tune_effective_batch=allow_batch_change,
        batch_size=parse_auto_int(batch_size, "--batch-size"),
        lr_scale_rule=lr_scale_rule,  # type: ignore[arg-type]
        checkpoint_dir=checkpoint_dir,
        resume=resume,
    )
    windows = forecast.load_windows(
        data,
        project=project,
        lookback=lookback,
        horizon=horizon,
        split=Split(val=parse_split_size(val, "--val"), test=parse_split_size(test, "--test")),
        target=target,
        project_column=project_column,
        time_column=time_column,
        fill=fill,
    )
    console = Console(stderr=as_json, quiet=quiet)
    if registry.resolve(model).kind == "classical":
        from gpufill.hardware import cpu_count
        from gpufill.models.classical import train_classical

        outcome = train_classical(windows, model, params, threads=cpu_count(), seed=seed).to_dict()
    elif as_json:
        outcome = forecast.train_forecaster(windows, model, params, config=config).to_dict()
    else:
        with render.EpochProgress(console) as progress:
            outcome = forecast.train_forecaster(windows, model, params, config=config, callbacks=[progress]).to_dict()
    if quiet:
        pass
    elif as_json:
        print(json.dumps(outcome, default=str))
    else:
        render.print_forecast(outcome, console)
    if outcome["status"] == "diverged":
        raise typer.Exit(1)


def _launch_torchrun(nproc: int) -> int:
    """Re-run this same `gpufill train` command under torchrun with `nproc` processes on this machine."""
    import subprocess

    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "gpufill.cli", *args]
    return subprocess.call(command)


def parse_slots(value: str | None, option: str) -> int | str | None:
    return None if value is None else parse_auto_int(value, option)


@app.command()
def run(
    campaign: Path = typer.Argument(..., help="Campaign YAML file."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Where the store, logs and checkpoints live (default ./gpufill-NAME)."),
    gpu_slots: Optional[str] = typer.Option(None, "--gpu-slots", help="N or auto (overrides the file's resources)."),
    cpu_slots: Optional[str] = typer.Option(None, "--cpu-slots", help="N or auto (overrides the file's resources)."),
    executor: str = typer.Option("local", "--executor", help="local (processes here), ray (gpufill[ray]) or slurm (gpufill[slurm], resources.slurm)."),
    address: Optional[str] = typer.Option(None, "--address", help="With --executor ray: the cluster to join (e.g. auto, HOST:6379); default a local Ray."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over: delete this workdir's store first."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before --fresh deletes results."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every trial (WORKDIR/logs/run-N.log)."),
) -> None:
    """Run a campaign; running it again resumes (done trials are kept)."""
    _run_campaign(campaign, workdir, gpu_slots, cpu_slots, executor, fresh, yes, command="gpufill run", verbose=verbose, address=address)


def _run_campaign(campaign: Path, workdir: Path | None, gpu_slots: str | None, cpu_slots: str | None, executor: str, fresh: bool, yes: bool, command: str,
                  verbose: bool = False, address: str | None = None) -> None:
    from rich.live import Live

    from gpufill import render
    from gpufill.campaign.executors import check_executor
    from gpufill.campaign.runner import Campaign, describe_lanes

    check_executor(executor, address)  # before the file is read or --fresh asks anything
    job = Campaign.from_yaml(campaign, workdir)
    if fresh and (job.workdir / "gpufill.db").exists() and not yes:
        if not sys.stdin.isatty():
            raise InputError("--fresh would delete this workdir's results", where=str(job.workdir), field="--fresh", fix="add --yes to confirm")
        typer.confirm(f"Delete the results in {job.workdir} and start over?", abort=True)
    console = Console()
    live = Live(console=console, refresh_per_second=4, transient=False)

    def on_start(prepared, run_id) -> None:
        for warning in prepared.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        for lane in describe_lanes(prepared.lanes):
            console.print(f"lane {lane['lane']}: {lane['slots']} slots x {lane['threads']} threads on {lane['device']} ({', '.join(lane['runs'])}): {lane['reason']}")
        console.print(f"{len(prepared.trials)} trials; workdir {job.workdir}")
        live.start()

    try:
        outcome = job.run(
            gpu_slots=parse_slots(gpu_slots, "--gpu-slots"),
            cpu_slots=parse_slots(cpu_slots, "--cpu-slots"),
            fresh=fresh,
            command=command,
            verbose=verbose,
            executor=executor,
            address=address,
            on_start=on_start,
            on_update=lambda snapshot: live.update(render.campaign_view(snapshot, job.spec.name)),
        )
    finally:
        live.stop()
        if not console.is_terminal:  # rich leaves the last frame without a newline when piped
            console.print()
    counts = job.status().to_dict()
    console.print(f"done {counts['done']}, failed {counts['failed']}, pending {counts['pending']} of {counts['total']} trials in {outcome.elapsed_s:.1f} s"
                  f" ({outcome.retried} retried, {outcome.crashed} worker crashes). Results: gpufill results --workdir {job.workdir}")
    if counts["failed"]:
        raise typer.Exit(1)


@app.command()
def demo(
    workdir: Path = typer.Option(Path("gpufill-demo"), "--workdir"),
    fresh: bool = typer.Option(False, "--fresh"),
    yes: bool = typer.Option(False, "--yes", "-y"),
) -> None:
    """Run the bundled example campaign (all 8 families, a few minutes on 2 CPU cores)."""
    from gpufill.campaign.runner import demo_campaign_path

    _run_campaign(demo_campaign_path(), workdir, None, None, "local", fresh, yes, command="gpufill demo")


@app.command()
def status(
    workdir: Optional[Path] = typer.Option(None, "--workdir"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Trial counts per status, overall and per lane; Slurm jobs queued or running."""
    from gpufill import render
    from gpufill.campaign.runner import find_workdir, read_jobs, read_status

    directory = find_workdir(workdir)
    counts = read_status(directory).to_dict()
    jobs = read_jobs(directory)
    if jobs:
        counts["jobs"] = [{"job_id": j["job_id"], "state": j["state"], "detail": j["detail"], "lane": j["lane"], "trials": len(j["trial_ids"])} for j in jobs]
    if as_json:
        print(json.dumps(counts))
        return
    console = Console()
    console.print(render.status_table(counts))
    for state in ("queued", "running"):
        ids = [j["job_id"] for j in jobs if j["state"] == state]
        if ids:
            console.print(f"Slurm jobs {state}: {len(ids)} ({', '.join(ids[:20])}{', ...' if len(ids) > 20 else ''})")


@app.command()
def results(
    workdir: Optional[Path] = typer.Option(None, "--workdir"),
    format_: str = typer.Option("table", "--format", help="table, csv, parquet or json."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write to this file instead of stdout (parquet needs it)."),
    summary: bool = typer.Option(False, "--summary", help="Best configuration per project and family."),
) -> None:
    """One row per trial (or, with --summary, the best configuration per project and family)."""
    from gpufill import render
    from gpufill.campaign.export import write_frame
    from gpufill.campaign.runner import best_per_project, find_workdir, read_results

    if format_ not in ("table", "csv", "parquet", "json"):
        raise InputError(f"unknown format {format_!r}", where="command line", field="--format", fix="use table, csv, parquet or json")
    frame = read_results(find_workdir(workdir))
    if summary:
        frame = best_per_project(frame)
    if format_ == "table" and out is None:
        Console().print(render.results_table(frame, summary=summary))
        return
    write_frame(frame, "csv" if format_ == "table" else format_, out)


@app.command()
def estimate(
    campaign: Path = typer.Argument(..., help="Campaign YAML file."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Predict a campaign's time per lane by timing a sample of each trial shape."""
    from gpufill import render
    from gpufill.campaign.estimate import estimate as run_estimate
    from gpufill.campaign.runner import Campaign

    console = Console(stderr=as_json)
    with console.status("timing a sample of each trial shape") as spinner:
        result = run_estimate(Campaign.from_yaml(campaign), progress=lambda text: spinner.update(f"timing {text}"))
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        console.print(render.estimate_table(result.to_dict()))


@app.command()
def monitor(
    workdir: Optional[Path] = typer.Option(None, "--workdir"),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Render once and exit (for scripts and logs)."),
) -> None:
    """Live dashboard of a running (or finished) campaign: lanes, rate, ETA, GPU and CPU sparklines."""
    import time

    from rich.live import Live

    from gpufill.campaign.runner import find_workdir
    from gpufill.monitor import live as dashboard

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
    workdir: Optional[Path] = typer.Option(None, "--workdir"),
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file to write (default WORKDIR/report.html)."),
) -> None:
    """Write one self-contained HTML report: summary, model comparison, resources, failures, alerts, plans."""
    from gpufill.campaign.runner import find_workdir
    from gpufill.report import write_report

    print(write_report(find_workdir(workdir), out))


@app.command()
def bench(
    model: str = typer.Option("lstm", "--model", "-m", help="lstm, gru, tcn, transformer or mlp."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs per training (default: sized for 1-2 minutes on 2 CPU cores)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Interleaved rounds; each row is the median round."),
    length: Optional[int] = typer.Option(None, "--length", help="Synthetic series length."),
    lookback: Optional[int] = typer.Option(None, "--lookback", help="Input window length."),
    hidden_size: Optional[int] = typer.Option(None, "--hidden-size", help="Width: hidden_size (channels for tcn, d_model for transformer)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    ablation: bool = typer.Option(True, "--ablation/--no-ablation", help="Also run gpufill with each of its speed-ups off in turn."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> None:
    """Before/after: the guides' starting loop vs gpufill on one model, and what each speed-up is worth here."""
    from gpufill.bench import BenchSettings, bench_table, run_bench, summary_lines

    sizes = {"epochs": epochs, "repeats": repeats, "length": length, "lookback": lookback, "hidden_size": hidden_size}
    settings = BenchSettings(model=model, device=device, ablation=ablation, **{k: v for k, v in sizes.items() if v is not None})
    console = Console(stderr=as_json)
    with console.status(f"bench {model}") as spinner:
        outcome = run_bench(settings, progress=lambda text: spinner.update(f"bench {model}: {text}"))
    record = outcome.to_dict()
    if out is not None:
        outcome.write(out)
    if as_json:
        print(json.dumps(record))
        return
    console.print(bench_table(record))
    for line in summary_lines(record):
        console.print(line)
    if out is not None:
        console.print(f"wrote {out}")


@app.command()
def doctor(
    model: str = typer.Option("lstm", "--model", "-m", help="Neural family (lstm, gru, tcn, transformer, mlp) or package.module:factory."),
    data: str = typer.Option("synthetic", "--data", help="synthetic, a .csv/.parquet file, a directory or a glob (as gpufill train)."),
    batch_size: int = typer.Option(128, "--batch-size", help="Batch the training is profiled at (and at twice it)."),
    lookback: int = typer.Option(30, "--lookback", help="Input window length."),
    steps: int = typer.Option(20, "--steps", help="Training steps to profile (after 3 warm-up steps)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Environment checks, a speed test against the peak, and what limits a training (with the fix and its expected gain)."""
    # torch is imported only when a command runs
    from gpufill.doctor import run as run_doctor
    from gpufill.doctor.display import print_report

    console = Console(stderr=as_json)
    with console.status("speed test and training profile"):
        record = run_doctor(model=model, data=data, batch_size=batch_size, lookback=lookback, steps=steps, device=device).to_dict()
    if as_json:
        print(json.dumps(record))
    else:
        print_report(record, console)


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except InputError as error:
        print(f"gpufill: error: {error.one_line()}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("gpufill: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:
        # Usage errors (click's, or typer's vendored click) show themselves and carry exit code 2.
        if hasattr(error, "show") and hasattr(error, "exit_code"):
            error.show()
            sys.exit(error.exit_code)
        raise


if __name__ == "__main__":
    main()
