"""fit's one line per epoch: the losses, samples/s, the epoch's time and what is left. A long training
that prints nothing looks hung; one that prints every step slows itself and buries the rest. The
line is written after the epoch's one read of the loss, so it costs no extra sync.
"""

from __future__ import annotations

import math
import sys
from typing import IO

from gpufill.engine.result import EpochRecord


def wants_lines(verbose: bool | str, stream: IO[str] | None = None) -> bool:
    """`verbose` as set; "auto": when the stream (stderr) is a terminal."""
    if verbose != "auto":
        return bool(verbose)
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def epochs_left(record: EpochRecord, epochs: int, max_steps: int | None, steps_done: int) -> float:
    """Epochs still to run after `record`: those set, or fewer where max_steps ends the training first."""
    left = float(epochs - record.epoch)
    if max_steps is not None and record.steps > 0:
        left = min(left, max(0, max_steps - steps_done) / record.steps)
    return max(left, 0.0)


def epoch_line(record: EpochRecord, epochs: int, seconds_per_epoch: float, left: float) -> str:
    """epoch 3/10  train loss 0.1234  val loss 0.2345  12,345 samples/s  3.2 s  ETA 22 s"""
    parts = [f"epoch {record.epoch}/{epochs}", f"train loss {record.train_loss:.4g}"]
    if record.val_loss is not None:
        parts.append(f"val loss {record.val_loss:.4g}")
    if record.samples and record.seconds > 0:
        parts.append(f"{record.samples / record.seconds:,.0f} samples/s")
    parts.append(f"{record.seconds:.3g} s" if record.seconds >= 1 else f"{record.seconds * 1e3:.3g} ms")
    if left > 0:
        parts.append(f"ETA {duration(left * seconds_per_epoch)}")
    return "  ".join(parts)


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
