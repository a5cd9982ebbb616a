"""Stopping a run on SIGINT, SIGTERM or SIGHUP: workers stopped, in-flight trials back to pending,
the run marked interrupted, and one line for the user (no worker tracebacks).

The scheduler's process turns SIGTERM and SIGHUP into the same exception Ctrl-C raises
(`Interrupted`), so one path stops everything however the run was stopped. Local workers
run in their own session, so a terminal's Ctrl-C or hang-up reaches only the scheduler,
which stops them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGHUP)
"""Raised as Interrupted in the scheduler (SIGINT already raises KeyboardInterrupt)."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunInterrupted(Exception):
    """What a stopped run left: raised by Campaign.run after the store is consistent again."""

    def __init__(self, signal_name: str, exit_code: int, returned: int, done: int, pending: int):
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name
        self.exit_code = exit_code
        """128 + the signal number, as a shell reports it (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
        self.returned = returned
        """Trials that were in flight, back to pending."""
        self.done = done
        self.pending = pending

    def one_line(self, resume: str) -> str:
        return (f"interrupted by {self.signal_name}: {self.done} done trials kept, {self.returned} in flight returned to pending, "
                f"{self.pending} pending; resume with: {resume}")


def from_exception(error: BaseException) -> tuple[str, int]:
    """(signal name, exit code) for a KeyboardInterrupt or an Interrupted."""
    signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
    return signal.Signals(signum).name, 128 + int(signum)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Interrupted in the main thread (elsewhere: unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, raise_interrupted) for signum in HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
