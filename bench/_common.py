"""What every benchmark shares: the environment record, the table and the JSON file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

# One environment record (device, versions, date) for these scripts and `gpufill bench`.
from gpufill.bench import environment

__all__ = ["RESULTS", "default_out", "environment", "finish", "print_table", "timed_command", "turned", "write_result"]

RESULTS = Path(__file__).parent / "results"
T = TypeVar("T")


def turned(arms: Sequence[T], round_index: int) -> list[T]:
    """The arms in round `round_index`'s order: each round starts one arm later, so that no arm always runs first."""
    shift = round_index % len(arms)
    return [*arms[shift:], *arms[:shift]]


def timed_command(command: list[str]) -> tuple[float, str]:
    """A whole process's wall seconds, start-up included, and its stdout; a failed command ends the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def default_out(script: str, env: dict[str, Any]) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{env['device_type']}-{env['device']}".lower()).strip("-")
    return RESULTS / f"{script}-{slug}-{env['date'][:10]}.json"


def write_result(path: Path, env: dict[str, Any], args: dict[str, Any], results: list[dict[str, Any]], ratios: dict[str, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**env, "args": args, "results": results, "ratios": ratios}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def print_table(title: str, rows: list[dict[str, Any]], ratios: dict[str, float], env: dict[str, Any]) -> None:
    """Scalar columns only; lists (per-seed values) stay in the JSON."""
    rows = [{k: v for k, v in row.items() if not isinstance(v, list | dict)} for row in rows]
    console = Console(width=max(100, Console().width))
    table = Table(title=f"{title} — {env['device']}, torch {env['torch']}, {env['date'][:10]}", title_justify="left")
    columns = list(dict.fromkeys(key for row in rows for key in row))  # rows may differ (an arm that failed has fewer)
    for column in columns:
        table.add_column(column, justify="left" if column in ("loop", "config") else "right")
    for row in rows:
        table.add_row(*("-" if row.get(column) is None else str(row[column]) for column in columns))
    console.print(table)
    for name, value in ratios.items():
        console.print(f"{name}: [bold]{value:.3g}[/bold]")


def finish(script: str, title: str, env: dict[str, Any], args: dict[str, Any], rows: list[dict[str, Any]], ratios: dict[str, float], out: Path | None) -> Path:
    """Every benchmark's ending: print the table and ratios, write the JSON (default bench/results/<script>-<device>-<date>.json)."""
    print_table(f"{script}: {title}", rows, ratios, env)
    path = out or default_out(script, env)
    write_result(path, env, args, rows, ratios)
    print(f"wrote {path}")
    return path
