"""The typer app every command registers on, and its --version."""

from __future__ import annotations

import typer

from gpufill import __version__

def _flags_without_a_type() -> None:
    """A flag takes no value, so its help shows no type. typer's rich help (0.2x) prints `<bool>` beside every
    flag (its plain help does not): the type column is left empty for flags, as click and older typer left it."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "gpufill_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: object) -> str | None:
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich.gpufill_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_a_type()

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


