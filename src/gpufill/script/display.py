"""The one-screen text of `gpufill doctor -- COMMAND` (the JSON is ScriptDiagnosis.to_dict)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_script_report(record: dict[str, Any], console: Console) -> None:
    training = record["training"]
    console.print(Text(f"gpufill doctor: {' '.join(record['command'])}", style="bold"))
    if training:
        table = Table(title="the training", title_justify="left", show_header=False)
        for key in ("device", "parameters", "optimizer", "batch_size", "precision", "flops_per_step", "tf32", "cudnn_benchmark", "compiled", "world_size"):
            value = training.get(key)
            table.add_row(key.replace("_", " "), "-" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value)))
        for loader in training.get("loaders", []):
            table.add_row("DataLoader", Text(f"{loader['at']}: batch {loader['batch_size']}, num_workers {loader['num_workers']}, "
                                             f"pin_memory {loader['pin_memory']}, persistent {loader['persistent_workers']}"))
        console.print(table)
    if record["shares"]:
        shares = Table(title=f"where a step's {record['step_ms']:.3g} ms go (medians)", title_justify="left")
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
        gain = f" (expected: {finding['expected_gain']:.2f}x; {finding['why']})" if finding["expected_gain"] else f" ({finding['why']})"
        console.print(Text(f"{rank}. {finding['what']}{gain}"))
    for item in record["not_measured"]:
        console.print(Text(f"not measured: {item}", style="yellow"))
    console.print(Text(f"the script: {record['stop_reason']}" + (f"; exit code {record['exit_code']}" if record["exit_code"] else "")))
