"""The typer app every command registers on, and its --version."""

from __future__ import annotations

import typer

from gpufill import __version__

app = typer.Typer(
    name="gpufill",
    help="Run deep-learning experiment campaigns at the speed of the hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)


