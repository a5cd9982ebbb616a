"""The one error type for bad user input.

Every bad-input path raises :class:`InputError`. The CLI prints it as one line and
exits with code 2; the Python API lets it propagate. The message always names
where the problem is (file or option), the field, what is wrong and the fix.
:func:`visible` makes user data safe to print on a terminal (the error line uses it too).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

# C0 and C1 control characters (ESC starts the sequences that clear a screen or set a window title), DEL,
# and the bidirectional overrides that reorder what a reader sees.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def describe(item: Any) -> str:
    """A value's structure in words, for messages (a batch, a model's output): "a dict with keys ['x', 'y']", "a tuple of 3"."""
    if isinstance(item, dict):
        return f"a dict with keys {sorted(item)}"
    if isinstance(item, tuple | list):
        return f"a {type(item).__name__} of {len(item)}"
    return f"a {type(item).__name__}"


def visible(text: object) -> str:
    """`text` safe to print on a terminal: every control character shown as its escape (ESC as \\x1b).

    User data (project names, grid values, file names) reaches the terminal through this: a name is
    shown as what it is, never run as a terminal command."""
    text = str(text)
    if not _INVISIBLE.search(text):  # the common case: nothing to replace
        return text
    return _INVISIBLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


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
        return visible(" ".join(f"{text}; fix: {self.fix}".split()))  # one line, always, with nothing a terminal would run


@contextlib.contextmanager
def exit_on_input_error(program: str) -> Iterator[None]:
    """For scripts: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except InputError as error:
        print(f"{program}: error: {error.one_line()}", file=sys.stderr)
        raise SystemExit(2) from None
