"""`gpufill bench` (before/after with ablations) and `gpufill doctor` (why a training is slow)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from gpufill.cli.app import app


@app.command()
def bench(
    model: str = typer.Option("lstm", "--model", "-m", help="lstm, gru, tcn, transformer or mlp."),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs per training (default: sized for 1-2 minutes on 2 CPU cores)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Interleaved rounds; each row is the median round."),
    length: int | None = typer.Option(None, "--length", help="Synthetic series length."),
    lookback: int | None = typer.Option(None, "--lookback", help="Input window length."),
    hidden_size: int | None = typer.Option(None, "--hidden-size", help="Width: hidden_size (channels for tcn, d_model for transformer)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1, ..."),
    ablation: bool = typer.Option(True, "--ablation/--no-ablation", help="Also run gpufill with each of its speed-ups off in turn."),
    hand_loop: bool = typer.Option(True, "--hand-loop/--no-hand-loop", help="Also run a careful hand-written fp32 loop (resident data, fused AdamW, no per-step sync)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> None:
    """Before/after: the guides' starting loop vs gpufill on one model, and what each speed-up is worth here."""
    from gpufill.bench import BenchSettings, bench_table, run_bench, summary_lines

    sizes = {"epochs": epochs, "repeats": repeats, "length": length, "lookback": lookback, "hidden_size": hidden_size}
    settings = BenchSettings(model=model, device=device, ablation=ablation, hand_loop=hand_loop, **{k: v for k, v in sizes.items() if v is not None})
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


