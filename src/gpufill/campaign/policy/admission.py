"""What the campaign has measured per shape (pack size, peak memory per pack size) and the GPU
lane's admission rule built on it.

Facts are measured once per shape and lane in a campaign and kept in the store, so a resumed
run sends packs of the measured size at once instead of measuring again; while a shape's
size is being measured no second worker measures it too.

Admission: a GPU lane runs tasks of any shapes side by side while the sum of their measured
peaks, plus every worker process's CUDA context (idle ones hold theirs too), stays under
`resources.memory_margin` of the device. A task whose peak is not known yet (the first pack
of a new shape) runs alone, and nothing joins it until its worker reports the measurement.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufill.campaign.policy.lanes import Lane

CONTEXT_BYTES_DEFAULT = 600 * 2**20
"""A CUDA context and library workspaces (cuBLAS, cuDNN) per process until a worker reports its own
(NVML per-process use minus PyTorch's reserved memory: ~500 MB on an H100 with torch 2.x)."""

META_KEY = "shape_facts"


@dataclass(slots=True)
class ShapeFact:
    """One shape on one lane: the fused pack size and why, and a task's peak device memory per K."""

    pack_size: int | None = None
    reason: str = ""
    kind: str | None = None
    """How its packs run (hand-written fused kernels or torch.func vmap), as measured; None: the default."""
    peak_bytes: dict[int, int] = field(default_factory=dict)

    def peak(self, k: int) -> int | None:
        """A task of k trials: measured at k, else at the next larger measured size (an upper
        bound), else scaled linearly from the largest one measured."""
        if not self.peak_bytes:
            return None
        larger = [size for size in self.peak_bytes if size >= k]
        if larger:
            return self.peak_bytes[min(larger)]
        largest = max(self.peak_bytes)
        return -(-self.peak_bytes[largest] * k // largest)


class ShapeBook:
    """Facts per (lane, shape), loaded from and saved to the store's meta table."""

    def __init__(self, facts: dict[tuple[str, str], ShapeFact] | None = None, *, fixed_pack_size: int | None = None):
        self.facts = facts or {}
        self.fixed_pack_size = fixed_pack_size
        self.measuring: set[tuple[str, str]] = set()
        """Shapes whose pack size a worker is measuring now: not sent to a second worker meanwhile."""

    # -- the store ------------------------------------------------------------------------
    @classmethod
    def from_json(cls, text: str | None, *, fixed_pack_size: int | None = None) -> ShapeBook:
        facts: dict[tuple[str, str], ShapeFact] = {}
        for row in json.loads(text) if text else []:
            facts[(row["lane"], row["shape"])] = ShapeFact(row.get("pack_size"), row.get("reason", ""), row.get("kind"),
                                                           {int(k): int(v) for k, v in row.get("peak_bytes", {}).items()})
        return cls(facts, fixed_pack_size=fixed_pack_size)

    def to_json(self) -> str:
        return json.dumps([{"lane": lane, "shape": shape, **asdict(fact)} for (lane, shape), fact in sorted(self.facts.items())])

    # -- pack sizes -----------------------------------------------------------------------
    def pack_size(self, lane: str, shape: str) -> int | None:
        """The size to send (None: not measured on this lane yet; the worker measures it)."""
        if self.fixed_pack_size is not None:
            return self.fixed_pack_size
        fact = self.facts.get((lane, shape))
        return None if fact is None else fact.pack_size

    def reason(self, lane: str, shape: str) -> str | None:
        """Why the shape trains at its pack size (None: not measured yet)."""
        if self.fixed_pack_size is not None:
            return f"resources.pack_size: {self.fixed_pack_size}"
        fact = self.facts.get((lane, shape))
        return None if fact is None else fact.reason

    def kind(self, lane: str, shape: str) -> str | None:
        fact = self.facts.get((lane, shape))
        return None if fact is None else fact.kind

    def learn_pack(self, lane: str, shape: str, message: dict[str, Any]) -> None:
        fact = self.facts.setdefault((lane, shape), ShapeFact())
        fact.pack_size, fact.reason, fact.kind = int(message["size"]), str(message["reason"]), message.get("kind")
        for k, peak in message.get("peak_bytes", {}).items():
            self.learn_peak(lane, shape, int(k), int(peak))
        self.measuring.discard((lane, shape))

    def learn_peak(self, lane: str, shape: str, k: int, peak: int) -> None:
        fact = self.facts.setdefault((lane, shape), ShapeFact())
        fact.peak_bytes[k] = max(peak, fact.peak_bytes.get(k, 0))

    def peak(self, lane: str, shape: str, k: int) -> int | None:
        fact = self.facts.get((lane, shape))
        return None if fact is None else fact.peak(k)


@dataclass(frozen=True, slots=True)
class Running:
    """A task the lane runs now: its shape and how many trials it trains at once."""

    shape: str
    trials: int


def admits(lane: Lane, book: ShapeBook, shape: str, trials: int, running: Iterable[Running], contexts: Iterable[int | None]) -> bool:
    """Whether `lane` may start a task of `trials` trials of `shape` beside `running`.

    `contexts` holds each of the lane's worker processes' context bytes (None: not reported).
    """
    if lane.memory_budget_bytes is None:
        return True
    running = list(running)
    peak = book.peak(lane.name, shape, trials)
    peaks = [book.peak(lane.name, r.shape, r.trials) for r in running]
    if peak is None or None in peaks:
        return not running  # unmeasured: it runs alone, and nothing joins it until it is measured
    held = sum(CONTEXT_BYTES_DEFAULT if c is None else c for c in contexts)
    return held + sum(peaks) + peak <= lane.memory_budget_bytes  # type: ignore[arg-type]
