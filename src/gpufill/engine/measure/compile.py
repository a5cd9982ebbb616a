"""Keep torch.compile only when it is measured to be faster than eager.

Compiling costs seconds to minutes once; it pays only if the compiled step is faster by
a margin. The first compiled call's time is reported as the compile cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpufill.engine.plan import Choice
from gpufill.engine.backend import synchronize
from gpufill.engine.measure.cache import TuneCache
from gpufill.engine.measure.timing import seconds_per_step

# Keep compile only when a step is at least this much faster: below it the gain is noise
# and recompiles (new shapes) could eat it.
MARGIN = 0.05


@dataclass(frozen=True, slots=True)
class CompileMeasurement:
    eager_step_s: float
    compiled_step_s: float
    compile_s: float
    """The first compiled call, which traces and compiles."""

    @property
    def speedup(self) -> float:
        return self.eager_step_s / self.compiled_step_s if self.compiled_step_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}


def decide_compile(measurement: CompileMeasurement, margin: float = MARGIN) -> Choice[bool]:
    m = measurement
    timing = (
        f"compiled step {m.compiled_step_s * 1e3:.3g} ms vs eager {m.eager_step_s * 1e3:.3g} ms "
        f"({m.speedup:.2f}x); compiling took {m.compile_s:.1f} s"
    )
    if m.speedup >= 1 + margin:
        return Choice(True, f"measured faster: {timing}")
    return Choice(False, f"off: measured not faster by {margin:.0%}: {timing}")


def time_compile(step: Callable[[Any], Any], stream: Iterator[Any], device: torch.device, *,
                 use_compiled: Callable[[], bool], on_error: Callable[[BaseException], None]) -> CompileMeasurement | None:
    """Eager steps, then the first compiled step (it traces and compiles: the compile cost), then
    compiled steps. `use_compiled` switches the forward and says whether it took; a compile error
    goes to `on_error` (which must leave eager in place) and gives None."""
    eager = seconds_per_step(step, stream, device)
    if not use_compiled():
        return None
    tick = time.perf_counter()
    try:
        step(next(stream))
        synchronize(device)
    except Exception as error:  # any compile failure: eager is always correct
        on_error(error)
        return None
    compile_s = time.perf_counter() - tick
    compiled = seconds_per_step(step, stream, device)
    return CompileMeasurement(eager_step_s=eager, compiled_step_s=compiled, compile_s=compile_s)


def cached_compile_choice(cache: TuneCache, key: str, measure: Callable[[], CompileMeasurement | None]) -> Choice[bool] | None:
    """`decide_compile` on the cached measurement for `key`, else on a new one (then cached); None when compiling failed."""
    cached = cache.get(key)
    measurement = CompileMeasurement(**cached) if cached is not None else measure()
    if measurement is None:
        return None
    if cached is None:
        cache.put(key, asdict(measurement))
        return decide_compile(measurement)
    decision = decide_compile(measurement)
    return Choice(decision.value, f"{decision.reason} (cached measurement)")
