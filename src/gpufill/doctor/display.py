"""Rich tables for `gpufill doctor`: environment, speed test against peak, step phases, verdict.

Everything is read from ``DoctorReport.to_dict()``, so the tables show exactly what
``--json`` prints.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["print_report"]

_STATUS_STYLE = {"ok": "[green]ok[/green]", "warn": "[bold yellow]warn[/bold yellow]", "info": "[dim]info[/dim]"}
_PHASE_NAMES = {"data_wait": "data wait (next(iterator))", "copy": "host -> device copy", "forward": "forward + loss",
                "backward": "zero_grad + backward", "optimizer": "optimizer step"}


def print_report(report: dict[str, Any], console: Console) -> None:
    console.print(environment_table(report["environment"]))
    console.print(speed_table(report["speed_test"]))
    console.print(phase_table(report["training"]))
    print_verdict(report["verdict"], console)


def _table(title: str, first: str, *right: str, last: str | None = None, plain: tuple[str, ...] = ()) -> Table:
    """A doctor's table: its first column bold, `plain` ones left-aligned, the `right` ones numbers, `last` a dim note."""
    table = Table(title=title, title_justify="left")
    table.add_column(first, style="bold")
    for name in plain:
        table.add_column(name)
    for name in right:
        table.add_column(name, justify="right")
    if last is not None:
        table.add_column(last, style="dim", overflow="fold")
    return table


def environment_table(checks: list[dict[str, str]]) -> Table:
    table = _table("Environment", "check", plain=("value", "status"), last="note")
    for check in checks:
        table.add_row(check["name"], check["value"], _STATUS_STYLE[check["status"]], check["note"])
    return table


def speed_table(speed: dict[str, Any]) -> Table:
    table = _table(f"Speed test on {speed['device']} ({speed['seconds']:.1f} s)", "measure", "measured", "peak", "of peak", last="how")
    rows = [(f"matmul {name}", rate) for name, rate in speed["matmul_tflops"].items()]
    rows.append(("memory copy", speed["memory_gbps"]))
    for label, rate in rows:
        ratio = rate["ratio_to_peak"]
        table.add_row(label, f"{rate['value']:.3g} {rate['unit']}", _maybe(rate["peak"], rate["unit"]),
                      "n/a" if ratio == "n/a" else f"{ratio:.0%}", rate["detail"])
    return table


def phase_table(training: dict[str, Any]) -> Table:
    table = _table(f"One training step: {training['description']}", "phase", "ms / step", "share")
    for name, seconds in training["phases_s"].items():
        table.add_row(_PHASE_NAMES[name], f"{seconds * 1e3:.3f}", f"{training['shares'][name]:.1%}")
    table.add_row("step", f"{training['step_s'] * 1e3:.3f}", "100%", style="bold")
    scaling = training["scaling"]
    doubled = scaling["compute_2b_s"]
    table.add_section()
    table.add_row(f"compute at batch {scaling['batch']}", f"{scaling['compute_b_s'] * 1e3:.3f}", "")
    table.add_row(f"compute at batch {2 * scaling['batch']}", "did not fit" if doubled is None else f"{doubled * 1e3:.3f}",
                  "" if scaling["ratio_2b_over_b"] is None else f"x{scaling['ratio_2b_over_b']:.2f}")
    if training["achieved_tflops"] is not None:
        table.add_row("achieved (forward + backward)", f"{training['achieved_tflops']:.3g} TFLOP/s", "")
    if training["syncs_per_step"] is not None:
        table.add_row("implicit host-device syncs", f"{training['syncs_per_step']:.1f} / step", "")
    return table


def print_verdict(verdict: dict[str, Any], console: Console) -> None:
    gain = verdict["expected_gain"]
    console.print(f"[bold]Verdict: {verdict['kind']}[/bold]: {verdict['reason']}")
    console.print(f"[bold]Fix:[/bold] {verdict['fix']}")
    console.print(f"[bold]Expected gain:[/bold] {'n/a' if gain is None else f'{gain:.2f}x'} ({verdict['expected_gain_reason']})")


def _maybe(value: Any, unit: str) -> str:
    return "n/a" if value == "n/a" else f"{value:g} {unit}"
