"""Keep torch.compile only when it is measured to be faster than eager.

Compiling costs seconds to minutes once; it pays only if the compiled step is faster by
a margin. The first compiled call's time is reported as the compile cost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpufill.plan import Choice

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
