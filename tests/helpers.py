"""Shared test helpers: small campaign files and the real CLI entry point run in-process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufill import cli


def run_cli(capsys, *args):
    old = sys.argv
    sys.argv = ["gpufill", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as done:
            cli.main()
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return done.value.code, out, err


def write_campaign(directory: Path, name: str = "tiny", models: str = "mlp: {hidden_size: 16}\n  linear: {}", projects: int = 2,
                   epochs: int = 2, retries: int = 1) -> Path:
    """A small campaign file; `models` is the YAML under `models:` (entries separated by newline + 2 spaces)."""
    path = directory / f"{name}.yaml"
    lines = [
        f"name: {name}",
        f"data: {{source: synthetic, projects: {projects}, length: 300, seed: 0}}",
        "task: {lookback: [12], horizon: 1}",
        "models:",
        f"  {models}",
        f"train: {{epochs: {epochs}, early_stopping: null}}",
        "seeds: [0]",
        f"resources: {{retries: {retries}}}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
