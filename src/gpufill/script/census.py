"""One training step seen operator by operator (the recorder's census step): how many operators
launch a kernel, the bytes they move, the matmuls' dtypes (the precision actually in effect), and
whether torch.compile built a graph. Runs in the user's process."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any


class StepCensus:
    """One step's operators as dispatched: how many launch a kernel, the bytes they read and write
    (inputs + outputs), and the dtypes of the matmul-like ones (what autocast actually ran)."""

    _MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "convolution", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")

    def __init__(self, dtypes: Counter[str]):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        from gpufill.engine.measure.ops import launches_kernel

        census, matmuls, tensor, strided = self, self._MATMULS, torch.Tensor, torch.strided
        self.ops = 0
        self.bytes: int | None = 0
        """None once a tensor's bytes could not be read (a sparse or nested layout): not counted, never the script's error."""

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                if launches_kernel(func):
                    census.ops += 1
                    if census.bytes is not None:
                        leaves = [leaf for leaf in tree_leaves((args, kwargs, out)) if isinstance(leaf, tensor)]
                        if all(leaf.layout is strided for leaf in leaves):
                            census.bytes += sum(leaf.numel() * leaf.element_size() for leaf in leaves)
                        else:
                            census.bytes = None
                    if func.overloadpacket.__name__ in matmuls and args and hasattr(args[0], "dtype"):
                        dtypes[str(args[0].dtype).replace("torch.", "")] += 1
                return out

        self._mode = Mode()

    def __enter__(self) -> StepCensus:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def compiled() -> bool:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["stats"].get("unique_graphs", 0))
    except Exception:  # noqa: BLE001 - private counters moved: say "not seen"
        return False


