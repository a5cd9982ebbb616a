"""The gpufill command line: parse, call the library, print. Exit 0 ok, 1 failed run, 2 bad input.

`app` holds the commands; each module registers its own: `train`, `campaign` (run, demo,
status, results, estimate, monitor, report), `forecast`, `tools` (bench, doctor) and `tracking` (export mlflow). `main` turns bad
input into one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

# Importing a command module registers its commands; help lists them in this order.
from gpufill.cli import train  # noqa: F401, I001
from gpufill.cli import campaign, forecast, tools, tracking  # noqa: F401
from gpufill.cli.app import app
from gpufill.errors import InputError

__all__ = ["app", "main"]


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except InputError as error:
        print(f"gpufill: error: {error.one_line()}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("gpufill: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:
        # Usage errors (click's, or typer's vendored click) show themselves and carry exit code 2.
        if hasattr(error, "show") and hasattr(error, "exit_code"):
            error.show()
            sys.exit(error.exit_code)
        raise


