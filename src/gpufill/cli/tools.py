"""`gpufill bench` (before/after with ablations) and `gpufill doctor` (why a training is slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gpufill.cli.app import app
from gpufill.engine.config import NAMED_LOSSES
from gpufill.forecasting.family_names import built_in
from gpufill.script.supervise import DEADLINE_S, GRACE_S


_MODEL_HELP = (f"A forecaster family ({', '.join(built_in('neural'))}), or pkg.mod:factory / file.py:factory (with --data pkg.mod:make_data: "
               "any model).")
_DATA_HELP = ("pkg.mod:make_data or file.py:make_data returning the training data (tensors of any structure, a Dataset, a DataLoader) "
              "or {'train': ..., 'val': ...}; for a forecaster: synthetic, a .csv/.parquet file, a directory or a glob.")
_LOSS_HELP = f"{', '.join(NAMED_LOSSES)}, or pkg.mod:fn with fn(model, batch) -> loss (any model)."
_TIMEOUT_HELP = ("-- COMMAND: seconds before {what} is ended (SIGTERM to its process group, SIGKILL --grace seconds later if it "
                 "ignores it); default: {default}.")
_GRACE_HELP = (f"-- COMMAND: seconds between the SIGTERM that ends the command and the SIGKILL if it ignores it (its own handlers and "
               f"`finally` blocks run in between: time to save a checkpoint); default {GRACE_S:g}.")


def _fit_options(pairs: list[str]) -> dict[str, Any]:
    """`--fit KEY=VALUE` pairs as FitConfig fields (values read as YAML: 0.1, true, warmup_cosine)."""
    import yaml

    from gpufill.errors import InputError

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--fit {pair!r} is not KEY=VALUE", where="command line", field="--fit", fix="write e.g. --fit weight_decay=0.1")
        options[key.strip()] = yaml.safe_load(value)
    return options


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    model: str = typer.Option("lstm", "--model", "-m", help=_MODEL_HELP),
    data: str | None = typer.Option(None, "--data", help="pkg.mod:make_data (any model; see gpufill doctor --help). Default: synthetic series for a forecaster."),
    loss: str = typer.Option("mse", "--loss", help=_LOSS_HELP),
    batch_size: int = typer.Option(128, "--batch-size", help="Any model: the batch of the before loop and gpufill's effective batch."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", help="Any model: the before loop accumulates loader batches of this size."),
    lr: float | None = typer.Option(None, "--lr", help="Any model: learning rate of every loop (default: fit's)."),
    fit: list[str] = typer.Option([], "--fit", help="Any model: a gpufill setting KEY=VALUE (a FitConfig field), repeatable: --fit weight_decay=0.1."),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs per training (default: sized for 1-2 minutes on 2 CPU cores)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Interleaved rounds; each row is the median round."),
    length: int | None = typer.Option(None, "--length", help="Synthetic series length."),
    lookback: int | None = typer.Option(None, "--lookback", help="Input window length."),
    hidden_size: int | None = typer.Option(None, "--hidden-size", help="Width: hidden_size (channels for tcn, d_model for transformer)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    ablation: bool = typer.Option(True, "--ablation/--no-ablation", help="Also run gpufill with each of its speed-ups off in turn."),
    hand_loop: bool = typer.Option(True, "--hand-loop/--no-hand-loop", help="Also run a careful hand-written fp32 loop (resident data, fused AdamW, no per-step sync)."),
    hand_tuned: bool = typer.Option(True, "--hand-tuned/--no-hand-tuned", help="Also run that loop with the guides' settings by hand (bf16 where fast, TF32, torch.compile)."),
    lightning: bool = typer.Option(True, "--lightning/--no-lightning", help="Also run Lightning's Trainer with its speed defaults (where Lightning is installed)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
    steps: int = typer.Option(30, "--steps", help="-- COMMAND: optimizer steps measured per run (after 3 warm-up steps)."),
    tries: list[str] = typer.Option([], "--try", help="-- COMMAND: only this speed-up (tf32, cudnn_benchmark, allocator, all), repeatable; "
                                                       "default: every one that applies to the script's device."),
    timeout: float = typer.Option(DEADLINE_S, "--timeout", help=_TIMEOUT_HELP.format(what="each run of the command", default=f"{DEADLINE_S:g} s")),
    grace: float = typer.Option(GRACE_S, "--grace", help=_GRACE_HELP),
) -> None:
    """Before/after: the guides' starting loop vs gpufill on one training, and what each speed-up is worth here.

    gpufill bench [--steps N] [--try NAME] [--repeats R] -- COMMAND ...: your own script as it is and with each speed-up
    gpufill can switch on from outside it (TF32, cudnn.benchmark, the allocator), samples/s each; code changes are listed with their line.
    """
    if out is not None:  # a directory, a link or a device there is refused now, not after the benchmark
        from gpufill.files import check_target

        check_target(out, field="--out")
    if ctx.args:
        _bench_script(list(ctx.args), steps=steps, tries=tuple(tries), repeats=repeats or 1, out=out, as_json=as_json, timeout=timeout, grace=grace)
        return
    from gpufill.bench import BenchSettings, bench_table, run_bench, summary_lines, target_from_references
    from gpufill.engine.config import DEFAULTS

    sizes = {"epochs": epochs, "repeats": repeats, "length": length, "lookback": lookback, "hidden_size": hidden_size}
    settings = BenchSettings(model=model, device=device, ablation=ablation, hand_loop=hand_loop, hand_tuned=hand_tuned, lightning=lightning,
                             **{k: v for k, v in sizes.items() if v is not None})
    target = None
    if data is not None:
        settings.validate(forecaster=False)  # a bad --repeats or --device fails before the user's code is imported
        target = target_from_references(model, data, loss=loss, batch_size=batch_size, micro_batch=micro_batch, lr=lr or DEFAULTS.lr,
                                        epochs=epochs or DEFAULTS.epochs, fit_options=_fit_options(fit), where="gpufill bench")
    console = Console(stderr=as_json)
    name = target.name if target is not None else model
    with console.status(f"bench {name}") as spinner:
        outcome = run_bench(settings, target=target, progress=lambda text: spinner.update(f"bench {name}: {text}"))
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def doctor(
    ctx: typer.Context,
    model: str = typer.Option("lstm", "--model", "-m", help=_MODEL_HELP),
    data: str = typer.Option("synthetic", "--data", help=_DATA_HELP),
    loss: str = typer.Option("mse", "--loss", help=_LOSS_HELP),
    batch_size: int = typer.Option(128, "--batch-size", help="Batch the training is profiled at (and at twice it)."),
    lookback: int = typer.Option(30, "--lookback", help="Input window length (a forecaster)."),
    steps: int = typer.Option(20, "--steps", help="Training steps to profile (after 3 warm-up steps)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    timeout: float = typer.Option(DEADLINE_S, "--timeout", help=_TIMEOUT_HELP.format(what="the command", default=f"{DEADLINE_S:g} s")),
    grace: float = typer.Option(GRACE_S, "--grace", help=_GRACE_HELP),
) -> None:
    """Environment checks, a speed test against the peak, and what limits a training (with the fix and its expected gain).

    gpufill doctor [--steps N] [--json] -- COMMAND ...: diagnose your own training script, unchanged.
    """
    if ctx.args:
        _doctor_script(ctx.args, steps=steps, as_json=as_json, timeout=timeout, grace=grace)
        return
    # torch is imported only when a command runs
    from gpufill.doctor import diagnose
    from gpufill.doctor import run as run_doctor
    from gpufill.doctor.display import print_report
    from gpufill.doctor.profiler import check_positive
    from gpufill.doctor.target import check_device
    from gpufill.user_code import is_reference

    console = Console(stderr=as_json)
    if is_reference(data):
        check_positive(batch_size=batch_size, steps=steps)
        check_device(device)  # bad options fail before the user's code is imported
        from gpufill.bench import target_from_references

        target = target_from_references(model, data, loss=loss, batch_size=batch_size, where="gpufill doctor")
        with console.status("speed test and training profile"):
            report = diagnose(target.make_model(), target.train, loss=target.loss, batch_size=batch_size, steps=steps, device=device)
    else:
        if loss != "mse":
            from gpufill.errors import InputError

            raise InputError(f"--loss {loss} needs --data pkg.mod:make_data: a forecaster is profiled with mse", where="gpufill doctor",
                             field="--loss", fix="drop --loss, or name your model and data with --model pkg.mod:factory --data pkg.mod:make_data")
        with console.status("speed test and training profile"):
            report = run_doctor(model=model, data=data, batch_size=batch_size, lookback=lookback, steps=steps, device=device)
    record = report.to_dict()
    if as_json:
        print(json.dumps(record))
    else:
        print_report(record, console)


def _doctor_script(command: list[str], *, steps: int, as_json: bool, timeout: float, grace: float) -> None:
    """`gpufill doctor -- COMMAND`: the script's own exit code passes through when it crashed or ended early."""
    from gpufill.doctor.profiler import check_positive
    from gpufill.script.diagnose import diagnose_script
    from gpufill.script.display import print_script_report

    check_positive(steps=steps)
    console = Console(stderr=as_json)
    diagnosis = diagnose_script(command, steps=steps, quiet_output=as_json, timeout_s=timeout, grace_s=grace)
    if as_json:
        print(json.dumps(diagnosis.to_dict()))
    else:
        print_script_report(diagnosis.to_dict(), console)
    if diagnosis.exit_code:
        raise typer.Exit(diagnosis.exit_code)


def _bench_script(command: list[str], *, steps: int, tries: tuple[str, ...], repeats: int, out: Path | None, as_json: bool, timeout: float,
                  grace: float) -> None:
    """`gpufill bench -- COMMAND`: a command that does not reach its measured steps is one line (its own exit code, or 2).
    How many times the command runs is said on stderr before the first run."""
    from gpufill.script.bench import ScriptNotMeasured, bench_script
    from gpufill.script.display import print_script_bench

    console = Console(stderr=as_json)
    talk = Console(stderr=True)  # the spinner and what must be seen before the table: stdout stays the table or the JSON
    try:
        with talk.status("gpufill bench") as spinner:
            outcome = bench_script(command, steps=steps, repeats=repeats, tries=tries, progress=lambda text: spinner.update(f"gpufill bench: {text}"),
                                   say=lambda text: talk.print(f"gpufill bench: {text}", markup=False, highlight=False, soft_wrap=True), timeout_s=timeout,
                                   grace_s=grace)
    except ScriptNotMeasured as failure:
        typer.echo(str(failure) + ("" if failure.run.exit_code else f"; fix: fewer --steps than {steps}, or a longer run"), err=True)
        raise typer.Exit(failure.run.exit_code or 2) from None
    record = outcome.to_dict()
    if out is not None:
        from gpufill.files import write_atomically

        write_atomically(out, json.dumps(record, indent=1), field="--out")
    if as_json:
        print(json.dumps(record))
    else:
        print_script_bench(record, console)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def watch(
    ctx: typer.Context,
    out: Path | None = typer.Option(None, "--out", help="Folder for the recording and report.html (default: gpufill-watch-DATE-TIME, or gpufill-watch-JOBID in a Slurm job)."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between samples of the GPUs and the host."),
    timeout: float | None = typer.Option(None, "--timeout", help=_TIMEOUT_HELP.format(what="the command", default="none (the whole run)")),
    grace: float = typer.Option(GRACE_S, "--grace", help=_GRACE_HELP),
) -> None:
    """gpufill watch [--out DIR] -- COMMAND ...: run your command to its end, recorded (GPU and host timeline, the training's
    step and data-wait times, alerts), then write an HTML report and print a summary. Its output and exit code pass through."""
    from gpufill.script.display import print_watch_summary
    from gpufill.script.watch import watch as watch_command

    outcome = watch_command(list(ctx.args), out, sample_every_s=interval, timeout_s=timeout, grace_s=grace)
    print_watch_summary(outcome.to_dict(), Console(stderr=True))  # stdout stays the command's own
    for problem in outcome.run.write_errors:  # e.g. a full disk: one line each; the command's exit code still passes through
        typer.echo(f"gpufill watch: warning: {problem}", err=True)
    if outcome.run.exit_code:
        raise typer.Exit(outcome.run.exit_code)
