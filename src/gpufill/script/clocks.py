"""The clocks a user's script is timed by: the host's, or the GPU's own timeline.

On a GPU the host runs ahead of the device, so host time puts the device's work wherever the
host next waits for it: a pageable `.to('cuda')` copy waits for every queued kernel, and a
compute-bound step would read as copy-bound. A doctor's run on a GPU is therefore timed with
CUDA events recorded at the same points, and the GPU's timeline answers the questions:
- a data wait is the GPU idling from the event before `next(loader)` to the one after it
  (zero when queued work covered the wait, the host's wait when the GPU had nothing to do);
- a copy, a backward or an optimizer step is the time between its events on the stream.

Both clocks hand out opaque marks and say how many seconds lie between two of them; the
recorder (recorder.py) keeps its arithmetic in one place for both.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

DATA, COPY, BACKWARD = 0, 1, 2
"""The spans a step accumulates besides its optimizer step, by index."""


class Clock(Protocol):
    timeline: str
    """'host' or 'gpu': which timeline the phases are on (reported with them)."""

    def now(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...

    def ready(self, mark: Any) -> bool:
        """Whether `mark`, and with it every mark before it on the same stream, can be read without waiting."""
        ...

    def wait(self, mark: Any) -> None: ...

    def capturing(self) -> bool:
        """Whether a CUDA graph is being captured now (no event may then be recorded or queried)."""
        ...

    def fresh(self) -> list[Any]:
        """An empty record of one step's spans."""
        ...

    def totals(self, spans: list[Any]) -> tuple[float, float, float]:
        """Seconds of data wait, copy and backward in one step's spans."""
        ...


class HostClock:
    """perf_counter; a step's spans are summed as they happen (three floats, no marks kept)."""

    timeline = "host"
    now = staticmethod(time.perf_counter)

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start

    @staticmethod
    def ready(mark: float) -> bool:
        return True

    @staticmethod
    def wait(mark: float) -> None:
        return None

    @staticmethod
    def capturing() -> bool:
        return False

    @staticmethod
    def fresh() -> list[float]:
        return [0.0, 0.0, 0.0]

    @staticmethod
    def totals(spans: list[float]) -> tuple[float, float, float]:
        return spans[DATA], spans[COPY], spans[BACKWARD]


class CudaClock:
    """CUDA events on the current stream: recording one costs a few microseconds and never waits.

    While the script captures a CUDA graph (the whole-network capture of PyTorch's docs puts the
    backward and the optimizer step inside it) no timing event may be recorded: the mark is None
    and spans ending or starting at it count zero (a capture computes nothing anyway)."""

    timeline = "gpu"

    def __init__(self, torch: Any, device: Any = None):
        self._event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing
        self._stream = None if device is None else torch.cuda.current_stream(device)
        """The training's stream (its parameters' device's current stream when it was first seen): every
        mark goes there, so a side-stream prefetch is timed where the step waits for it, and marks are read in order."""

    def capturing(self) -> bool:
        return bool(self._capturing())

    def now(self) -> Any:
        if self._capturing():
            return None
        event = self._event(enable_timing=True)
        event.record(self._stream)
        return event

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        if start is None or end is None:
            return 0.0
        return start.elapsed_time(end) / 1e3  # milliseconds between the two on the GPU

    @staticmethod
    def ready(mark: Any) -> bool:
        return mark is None or bool(mark.query())

    @staticmethod
    def wait(mark: Any) -> None:
        if mark is not None:
            mark.synchronize()

    @staticmethod
    def fresh() -> list[tuple[int, Any, Any]]:
        return []  # (kind, start event, end event), read once the step's end has passed on the GPU

    @staticmethod
    def totals(spans: list[tuple[int, Any, Any]]) -> tuple[float, float, float]:
        sums = [0.0, 0.0, 0.0]
        for kind, start, end in spans:
            sums[kind] += CudaClock.seconds(start, end)
        return sums[DATA], sums[COPY], sums[BACKWARD]
