"""The one error type for bad user input.

Every bad-input path raises :class:`InputError`. The CLI prints it as one line and
exits with code 2; the Python API lets it propagate. The message always names
where the problem is (file or option), the field, what is wrong and the fix.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


class InputError(ValueError):
    """Bad user input: one line naming where, the field, the problem and the fix."""

    def __init__(self, problem: str, *, fix: str, where: str | None = None, field: str | None = None):
        self.problem = problem
        self.fix = fix
        self.where = where
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        location = ": ".join(part for part in (self.where, self.field) if part)
        text = f"{location}: {self.problem}" if location else self.problem
        return " ".join(f"{text}; fix: {self.fix}".split())  # one line, always


@contextlib.contextmanager
def exit_on_input_error(program: str) -> Iterator[None]:
    """For scripts: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except InputError as error:
        print(f"{program}: error: {error.one_line()}", file=sys.stderr)
        raise SystemExit(2) from None
