"""The one-screen text of `gpufill doctor -- COMMAND` (the JSON is ScriptDiagnosis.to_dict)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufill.script.diagnose import gain_text, loader_text
from gpufill.script.supervise import left_running_text


def print_script_report(record: dict[str, Any], console: Console) -> None:
    training = record["training"]
    console.print(Text(f"gpufill doctor: {' '.join(record['command'])}", style="bold"))
    if training:
        table = Table(title="the training", title_justify="left", show_header=False)
        for key in ("device", "parameters", "optimizer", "steps", "batch_size", "precision", "flops_per_step", "tf32", "cudnn_benchmark", "compiled", "world_size"):
            value = training.get(key)
            table.add_row(key.replace("_", " "), "-" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value)))
        for loader in training.get("loaders", []):
            table.add_row("DataLoader", Text(loader_text(loader)))
        console.print(table)
    if record["shares"]:
        clock = "; on the GPU's timeline (CUDA events)" if record.get("timed_on") == "gpu" else ""
        shares = Table(title=f"where a step's {record['step_ms']:.3g} ms go (medians{clock})", title_justify="left")
        for name in record["shares"]:
            shares.add_column(name.replace("_", " "), justify="right")
        shares.add_row(*(f"{v:.0%}" for v in record["shares"].values()))
        console.print(shares)
    for source, figures in record.get("machine", {}).items():
        console.print(Text(f"{source}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in figures.items() if v is not None), style="dim"))
    verdict = record["verdict"]
    if verdict:
        console.print(Text(f"verdict: {verdict['kind']}: {verdict['reason']}", style="bold"))
    for rank, finding in enumerate(record["findings"], start=1):
        gain = f" (expected: {gain_text(finding)}; {finding['why']})" if finding["expected_gain"] else f" ({finding['why']})"
        console.print(Text(f"{rank}. {finding['what']}{gain}"))
    for item in record["not_measured"]:
        console.print(Text(f"not measured: {item}", style="yellow"))
    console.print(Text(f"the script: {record['stop_reason'] or 'no report from it'}" + (f"; exit code {record['exit_code']}" if record["exit_code"] else "")))
    print_ending(record, console)


def print_ending(record: dict[str, Any], console: Console) -> None:
    """How gpufill ended the command, and what it left running: one line each."""
    if record.get("ending"):
        console.print(Text(f"gpufill ended it: {record['ending']}", style="yellow"), soft_wrap=True)  # one line, however narrow the terminal
    for line in left_running_text(record.get("left_running", [])):
        console.print(Text(line, style="yellow"), soft_wrap=True)


def print_watch_summary(record: dict[str, Any], console: Console) -> None:
    """One screen after `gpufill watch`: the run, its steps, the machine, alerts, verdict and top fixes."""
    slurm = record["slurm"]
    job = f" · Slurm job {slurm['job_id']}" + (f" task {slurm['task']}" if "task" in slurm else "") if "job_id" in slurm else ""
    console.print(Text(f"gpufill watch: {' '.join(record['command'])}", style="bold"))
    console.print(Text(f"ran {record['duration_s']:.1f} s on {record['host']}, exit code {record['exit_code']}{job}; {record['stop_reason']}"))
    if record["step_ms"] is not None:
        rate = f", {record['samples_per_s']:.4g} samples/s (batch {record['training']['batch_size']})" if record["samples_per_s"] else ""
        console.print(Text(f"training: {record['optimizer_steps']} optimizer steps, {record['step_ms']:.3g} ms per step (mean){rate}"))
        console.print(Text("step time: " + " · ".join(f"{name.replace('_', ' ')} {share:.0%}" for name, share in record["shares"].items())))
    for source, figures in record["machine"].items():
        console.print(Text(f"{source}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in figures.items() if v is not None), style="dim"))
    for alert in record["alerts"][:5]:
        console.print(Text(f"alert at {alert['at_s']:.0f} s: {alert['message']}", style="yellow"))
    if len(record["alerts"]) > 5:
        console.print(Text(f"... and {len(record['alerts']) - 5} more alerts (in the report)", style="yellow"))
    if record["verdict"]:
        console.print(Text(f"verdict: {record['verdict']['kind']}: {record['verdict']['reason']}", style="bold"))
    for rank, finding in enumerate(record["findings"][:3], start=1):
        gain = f" (expected {gain_text(finding)})" if finding["expected_gain"] else ""
        console.print(Text(f"{rank}. {finding['what']}{gain}"))
    for item in record["not_measured"]:
        console.print(Text(f"not measured: {item}", style="yellow"))
    print_ending(record, console)
    console.print(Text(f"report: {record['folder']}/report.html (timelines, step breakdown, verdict); data: {record['folder']}/"))


def print_script_bench(record: dict[str, Any], console: Console) -> None:
    """`gpufill bench -- COMMAND`: one row per variant, the noise, what was skipped, then the code changes with their lines."""
    rounds = f"median of {record['repeats']} round" + ("s" if record["repeats"] != 1 else "")
    table = Table(title=f"gpufill bench: {' '.join(record['command'])} — {record['steps']} steps per run, {rounds}; {record['device']} "
                        f"({record['device_type']}), torch {record['torch']}, {record['date'][:10]}", title_justify="left")
    for column, justify in (("variant", "left"), (record["unit"], "right"), ("vs as is", "right"), ("note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in record["variants"]:
        gain = "" if row["vs_as_is"] is None or row["variant"] == "as is" else f"{row['vs_as_is']:.2f}x" + (" (noise)" if row["within_noise"] else "")
        table.add_row(row["variant"], "-" if row["rate"] is None else f"{row['rate']:.4g}", gain, Text(row["note"] or row["what"]))
    console.print(table)
    if record["noise"] is not None:
        runs = ", ".join(f"{rate:.4g}" for rate in record["variants"][0]["runs"])
        console.print(Text(f"noise: the as-is runs ({runs} {record['unit']}; the first and the last of the bench) differ by {record['noise']:.1%}; "
                           "a gain inside that is marked (noise)", style="dim"))
    for line in record["skipped"]:
        console.print(Text(f"not run: {line}", style="dim"))
    for line in record.get("endings", []):
        console.print(Text(line, style="yellow"), soft_wrap=True)
    if record["code_changes"]:
        console.print(Text("changes to the script itself (not applied; from the diagnosis of the as-is run):", style="bold"))
        for rank, change in enumerate(record["code_changes"], start=1):
            gain = f" (expected {gain_text(change)})" if change["expected_gain"] else ""
            console.print(Text(f"{rank}. {change['what']}{gain}"))
