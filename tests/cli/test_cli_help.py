"""Every command's --help: flags show no `<bool>` type (they take no value), options that take one show it."""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from gpufill.cli import app


def test_no_flag_shows_a_bool_placeholder_in_any_commands_help():
    commands = sorted(typer.main.get_command(app).commands)
    assert {"run", "results", "doctor", "watch", "bench", "train", "monitor", "report"} <= set(commands)
    runner = CliRunner()
    for name in commands:
        shown = runner.invoke(app, [name, "--help"], terminal_width=120)
        assert shown.exit_code == 0 and "--help" in shown.output, name
        assert "<bool>" not in shown.output, (name, shown.output)
    run_help = runner.invoke(app, ["run", "--help"], terminal_width=120).output
    assert "<path>" in run_help and "--fresh" in run_help  # a value's type stays
