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


def test_help_lines_list_the_registries_names():
    """Loss and family names in help come from their one list (engine/config.py NAMED_LOSSES, the family catalogue):
    none is left out (train's help once lacked mape, bench's smape and mape, its family list nbeats)."""
    import re

    from gpufill.engine.config import NAMED_LOSSES, REGRESSION_LOSSES
    from gpufill.forecasting.family_names import built_in

    runner = CliRunner()

    def words(command: str) -> set[str]:
        text = runner.invoke(app, [command, "--help"], terminal_width=400).output
        return set(re.findall(r"[a-z_]+", text))

    assert set(NAMED_LOSSES) <= words("bench") and set(NAMED_LOSSES) <= words("doctor")
    assert set(REGRESSION_LOSSES) <= words("train") and set(built_in()) <= words("train")
    assert set(built_in("neural")) <= words("bench") and "nbeats" in built_in("neural")
