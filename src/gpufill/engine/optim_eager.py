"""torch's own optimizers for an eager training, without the second of start-up their first call costs.

`torch.optim.Optimizer` wraps `add_param_group` and `zero_grad` in `torch._disable_dynamo`, and every `step` in a
wrapper that imports `torch._dynamo`: so that a `torch.compile` tracing the training does not trace into them. The
first call imports torch._dynamo (with sympy and the FX passes): 1.07 s on a 2-core AMD EPYC, a sixth of a
6-second training script, paid before the first step whether anything is compiled or not.

An eager training compiles nothing, so nothing can trace into its optimizer: `eager_class(kind)` is a subclass of
`kind` whose decorated methods (add_param_group, zero_grad, step, and a checkpoint's state_dict and load_state_dict)
call the undecorated functions the decorators wrap (`__wrapped__`, which functools.wraps keeps), with gradients off
as torch's step wrapper sets them. Same class for isinstance, schedulers
and state dicts; same kernels (`fused`, `foreach`) and so the same numbers bit for bit (tests/engine/test_optim.py).
A plan that compiles uses torch's classes as they are.

Adam and AdamW with the fused kernel on a CPU also skip the Python around the kernel once their state exists:
`engine/optim_listed.py`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from gpufill.engine.optim_listed import Listing


def _undecorated(function: Any) -> Any:
    """What a torch decorator wraps (itself when this torch version does not decorate it)."""
    return getattr(function, "__wrapped__", function)


@cache
def eager_class(kind: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`kind` with add_param_group, zero_grad, step, state_dict and load_state_dict free of the lazy torch._dynamo import."""
    add_param_group = _undecorated(kind.add_param_group)
    zero_grad = _undecorated(kind.zero_grad)
    step = _undecorated(kind.step)
    state_dict = _undecorated(kind.state_dict)  # a checkpoint's save and resume
    load_state_dict = _undecorated(kind.load_state_dict)

    listable = issubclass(kind, torch.optim.Adam | torch.optim.AdamW)

    class Eager(kind):  # type: ignore[valid-type, misc]
        _listing: Listing | None = None

        def add_param_group(self, param_group: dict[str, Any]) -> None:
            add_param_group(self, param_group)

        def zero_grad(self, set_to_none: bool = True) -> None:
            zero_grad(self, set_to_none)

        def step(self, closure: Any = None) -> Any:
            listing = self._listing
            if listing is None and listable:
                listing = self._listing = Listing()
            if closure is None and listing is not None and listing.step(self):
                return None
            with torch.no_grad():  # torch's step wrapper: no autograd graph of the update (differentiable=False)
                result = step(self, closure)
            if listing is not None:
                listing.after_torch_step(self)
            return result

        def state_dict(self) -> dict[str, Any]:
            return state_dict(self)

        def load_state_dict(self, state: dict[str, Any]) -> None:
            load_state_dict(self, state)

    Eager.__name__ = Eager.__qualname__ = kind.__name__
    Eager.__module__ = __name__
    return Eager
