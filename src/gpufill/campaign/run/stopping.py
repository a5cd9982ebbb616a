"""Stopping a run on SIGINT, SIGTERM or SIGHUP: workers stopped, in-flight trials back to pending,
the run marked interrupted, and one line for the user (no worker tracebacks).

While the scheduler runs, SIGINT, SIGTERM and SIGHUP are recorded, not raised: the scheduler's
loop (every 0.1 s) raises `Interrupted` at the top of an iteration, so the stop never lands
inside a half-finished step: a store write, a worker spawn, or the live display's lock (a
KeyboardInterrupt raised there once left rich's lock held and the run hung in `Live.stop`).
A second signal raises at once, for a user whose run is stuck in a long call. Local workers
run in their own session, so a terminal's Ctrl-C or hang-up reaches only the scheduler,
which stops them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


class StopRequest:
    """The first stopping signal received, acted on by `check` at the scheduler's next safe point."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def record(self, signum: int, _frame: FrameType | None = None) -> None:
        if self.signum is not None:  # the second signal: the user insists, stop wherever the run is
            raise Interrupted(signum)
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextmanager
def signals_interrupt() -> Iterator[StopRequest]:
    """Within the block, SIGINT, SIGTERM and SIGHUP are recorded in the StopRequest it yields
    (outside the main thread, where handlers cannot be set: nothing is recorded)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {signum: signal.signal(signum, request.record) for signum in HANDLED}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
