"""Counting the operators a step dispatches: a device-independent stand-in for kernel launches.

On a GPU a small model's step is bounded by how many kernels it launches (5-10 us of host
time each), not by its math. Each ATen operator that computes (not a view or a metadata
change) launches at least one kernel, so counting them under a dispatch mode measures the
launch cost on any machine, a CPU included, and makes "fewer, fatter kernels" testable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

_NO_KERNEL = {"detach", "alias", "lift_fresh", "_to_copy_noop", "set_", "_local_scalar_dense_noop"}
"""Operators that only change metadata: they launch no kernel (views are recognised by their schema)."""


@dataclass(slots=True)
class OpCount:
    """Operators dispatched while a block ran: the total and the busiest by name."""

    total: int = 0
    by_name: Counter[str] = field(default_factory=Counter)

    def top(self, n: int = 8) -> list[tuple[str, int]]:
        return self.by_name.most_common(n)


def launches_kernel(func: Any) -> bool:
    """False for views (their schema returns an alias of an input) and metadata-only operators."""
    schema = func._schema
    if func.overloadpacket.__name__ in _NO_KERNEL:
        return False
    # A view returns an alias of an input and writes nothing: no kernel.
    returns_alias = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    return not returns_alias


class _Counting(TorchDispatchMode):
    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if launches_kernel(func):
            self.count.total += 1
            self.count.by_name[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(block: Callable[[], Any]) -> OpCount:
    """Run `block` once and count the computing operators it dispatched (backward included)."""
    count = OpCount()
    with _Counting(count):
        block()
    return count
