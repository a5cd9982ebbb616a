"""A measurement stopped at its deadline: how the probe keeps its budget when a candidate (a compile, a stalled
step) runs far past what was estimated.

`deadline(seconds)` arms a one-shot real-time timer (SIGALRM) whose handler raises `Abandoned` in the main thread,
between two Python bytecodes: a compile's tracing, the wait on its compiler processes, a `time.sleep` all end there.
`Abandoned` is a BaseException, so neither the probe's nor torch.compile's `except Exception` (dynamo falls back
to eager on errors) swallows it. The probe arms it inside the contexts that put the weights back, never around them:
putting back must run whole (an `Abandoned` raised midway would leave a weight, a gradient or a random state as the
measurement left it, and the training would start from there). Where the timer
cannot be used (a thread other than the main one, or a process whose SIGALRM or real-time timer is already someone
else's) nothing is armed and the candidate is bounded by its estimate alone; `deadline` yields whether it armed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Abandoned", "deadline"]


class Abandoned(BaseException):
    """Raised where a measurement was when its deadline passed."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[bool]:
    """Within the block, `Abandoned` is raised once `seconds` pass (None: no deadline). Yields whether it is armed."""
    if seconds is None or not _timer_is_free():
        yield False
        return
    armed = True

    def expire(signum: int, frame: FrameType | None) -> None:
        nonlocal armed
        if armed:  # once at most; a signal that arrives as the block ends is ignored, never raised outside it
            armed = False
            raise Abandoned(f"past its deadline of {seconds:.1f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
        yield True
    finally:
        try:
            armed = False
        finally:  # runs even where the signal raised just before the line above
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _timer_is_free() -> bool:
    return (threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
