"""`gpufill train`: one training on built-in or user data, alone or under torchrun (--nproc)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

import typer
from rich.console import Console

from gpufill.cli.app import app
from gpufill.cli.options import (
    parse_auto_int,
    parse_params,
    parse_split_size,
    parse_switch,
)
from gpufill.engine.config import DEFAULTS, REGRESSION_LOSSES
from gpufill.forecasting.data.scalings import SCALINGS
from gpufill.forecasting.family_names import built_in
from gpufill.forecasting.training import FORECAST_EPOCHS, FORECAST_PATIENCE
from gpufill.errors import InputError


@app.command()
def train(
    model: str = typer.Option(..., "--model", "-m", help=f"Model family ({', '.join(built_in(references=False))}; references {', '.join(built_in(references=True))}) or package.module:factory."),
    data: str = typer.Option("synthetic", "--data", help="synthetic, a .csv/.parquet file, a directory or a glob."),
    project: str | None = typer.Option(None, "--project", help="Project to train on (default: the first one)."),
    lookback: int = typer.Option(30, "--lookback", help="Input window length."),
    horizon: int = typer.Option(1, "--horizon", help="Steps to forecast."),
    epochs: int = typer.Option(FORECAST_EPOCHS, "--epochs", help="Upper bound: early stopping on validation ends the training sooner."),
    batch_size: str = typer.Option("auto", "--batch-size", help="Effective batch, or auto."),
    precision: str = typer.Option("auto", "--precision", help="auto, bf16, fp16 or fp32."),
    compile_: str = typer.Option("auto", "--compile", help="auto, on or off."),
    batch_search: str = typer.Option("auto", "--batch-search", help="auto, on or off: measure micro-batch sizes, keep the fastest."),
    allow_batch_change: bool = typer.Option(False, "--allow-batch-change", help="Let the batch search change the effective batch (lr scaled by --lr-scale)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    lr: float = typer.Option(DEFAULTS.lr, "--lr", help="Learning rate at the reference batch (128)."),
    lr_scale_rule: str = typer.Option(DEFAULTS.lr_scale_rule, "--lr-scale", help="linear, sqrt or none: how lr follows the batch."),
    patience: int = typer.Option(FORECAST_PATIENCE, "--patience", help="Early stopping patience: validations without improvement before training stops; 0 turns early stopping off."),
    seed: int = typer.Option(DEFAULTS.seed, "--seed"),
    param: list[str] = typer.Option([], "--param", "-p", help="Model parameter KEY=VALUE (repeatable)."),
    val: str = typer.Option("0.1", "--val", help="Validation split: fraction or count of final steps."),
    test: str = typer.Option("0.2", "--test", help="Test split: fraction or count of final steps (e.g. 18)."),
    target: str = typer.Option("target", "--target", help="Target column (csv/parquet)."),
    project_column: str = typer.Option("project", "--project-column", help="Project column (csv/parquet)."),
    time_column: str | None = typer.Option(None, "--time-column", help="Time column (default: time/date/timestamp if present)."),
    fill: str = typer.Option("none", "--fill", help="NaN handling: none (error), ffill, interpolate or zero."),
    scaling: str = typer.Option("auto", "--scaling", help=f"Per-window scaling: auto (the family's recipe), {', '.join(SCALINGS[:-1])} or {SCALINGS[-1]}."),
    loss: str = typer.Option("auto", "--loss", help=f"Loss of a network: auto (the family's recipe), {', '.join(REGRESSION_LOSSES)}."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Save a checkpoint every epoch here."),
    resume: bool = typer.Option(False, "--resume", help="Continue from --checkpoint-dir's last checkpoint."),
    nproc: int = typer.Option(1, "--nproc", help="Processes for data-parallel training (DDP through torchrun): one per GPU, or CPU processes on gloo."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (plan, metrics, timings) instead of tables; progress goes to stderr as JSON lines."),
    forecasts: bool = typer.Option(False, "--forecasts", help="With --json: add the test and validation forecasts (arrays, one value per window and step)."),
) -> None:
    """Train one forecaster on one project, with the plan explained and metrics against the naive forecast."""
    if nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {nproc}", where="command line", field="--nproc", fix="pass e.g. --nproc 2")
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        from gpufill.engine.launch import relaunch_under_torchrun  # re-runs this same `gpufill train` command

        raise typer.Exit(relaunch_under_torchrun(nproc, ["-m", "gpufill.cli"]))
    quiet = int(os.environ.get("RANK", "0")) != 0  # under DDP rank 0 reports for all
    from gpufill.cli import render  # torch is imported only when a command runs
    from gpufill.engine.config import FitConfig
    from gpufill.engine.hardware import check_device
    from gpufill.forecasting import task as forecast
    from gpufill.forecasting.data import Split
    from gpufill.forecasting.data.window_scaling import scale_windows
    from gpufill.forecasting.models import registry
    from gpufill.forecasting.recipes import LOSSES, recipe
    from gpufill.forecasting.run import run_alone, trial_setup
    from gpufill.forecasting.trial import Trial

    params = parse_params(param)
    with _as_options():  # a bad setting names its command-line option, before any data is read
        config = FitConfig(
            epochs=epochs,
            lr=lr,
            patience=patience,  # 0: early stopping off, as in fit and a campaign (FitConfig keeps it as None)
            seed=seed,
            device=device,
            precision=precision,  # type: ignore[arg-type]  # checked by validate()
            compile=parse_switch(compile_, "--compile"),
            batch_search=parse_switch(batch_search, "--batch-search"),
            tune_effective_batch=allow_batch_change,
            batch_size=parse_auto_int(batch_size, "--batch-size"),
            lr_scale_rule=lr_scale_rule,  # type: ignore[arg-type]
            checkpoint_dir=checkpoint_dir,
            resume=resume,
        )
        config.validate()
        check_device(device)
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
    family = registry.resolve(model)
    with _as_options():  # the campaign's recipe for the family (forecasting/recipes.py)
        settings = recipe(model, scaling=_one_of("--scaling", scaling, ("auto", *SCALINGS)), loss=_one_of("--loss", loss, ("auto", *LOSSES)))
    trial = Trial(trial_id="", project=windows.name, family=model, kind=family.kind, params=params, train={}, seed=seed, lookback=lookback, shape="")
    setup = trial_setup(trial, settings, config, threads="auto")
    if not setup.fits_series:
        windows = scale_windows(windows, setup.recipe.scaling)
    console = Console(stderr=as_json, quiet=quiet)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_checkpoint_option())
        if quiet or family.kind == "classical":
            progress = []
        elif as_json:
            progress = [render.JsonProgress(sys.stderr)]
            progress[0].say(event=f"training {model} on {windows.name}")
        else:
            progress = [stack.enter_context(render.EpochProgress(console))]
        outcome = run_alone(trial, windows, setup, callbacks=progress).to_message()
    if quiet:
        pass
    elif as_json:
        if not forecasts:  # arrays of one value per window and step: asked for, never by default
            outcome = {key: value for key, value in outcome.items() if key not in ("forecasts", "val_forecasts")}
        print(json.dumps(outcome, default=str))
    else:
        render.print_forecast(outcome, console)
    if outcome["status"] == "diverged":
        raise typer.Exit(1)


# FitConfig fields -> the options that set them (for errors that name what the user typed).
_OPTIONS = {"epochs": "--epochs", "lr": "--lr", "patience": "--patience", "seed": "--seed", "device": "--device", "precision": "--precision",
            "compile": "--compile", "batch_search": "--batch-search", "batch_size": "--batch-size", "lr_scale_rule": "--lr-scale",
            "checkpoint_dir": "--checkpoint-dir", "resume": "--resume", "loss": "--loss"}


def _one_of(option: str, value: str, known: tuple[str, ...]) -> str:
    if value not in known:
        raise InputError(f"{option} {value!r} is not a choice", where="command line", field=option, fix=f"pass {option} as one of {', '.join(known)}")
    return value


@contextlib.contextmanager
def _checkpoint_option() -> Iterator[None]:
    """A checkpoint folder that cannot be written (read-only, full, held by another training) under the option's name, path kept."""
    try:
        yield
    except InputError as error:
        if error.field != "checkpoint_dir":
            raise
        raise InputError(error.problem, where=error.where, field="--checkpoint-dir", fix=error.fix.replace("checkpoint_dir", "--checkpoint-dir")) from None


@contextlib.contextmanager
def _as_options() -> Iterator[None]:
    """Re-raise a FitConfig error under the command-line option that set the field."""
    try:
        yield
    except InputError as error:
        option = _OPTIONS.get(error.field or "")
        if option is None:
            raise
        fix = error.fix.replace(f"set {error.field} to", f"pass {option}").replace(" or None", "")
        problem = error.problem.replace(" or None", "")  # None cannot be typed on a command line
        raise InputError(problem, where="command line", field=option, fix=fix) from None
