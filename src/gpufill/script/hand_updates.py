"""Trainings that update their parameters by hand (`p.data.add_(-lr * p.grad)`, as pytorch/examples'
word_language_model does): no optimizer step ever fires, so the steps are counted at each backward.

Deciding needs care, because gradient accumulation also runs several backwards per optimizer step:
a training is taken as hand-updated only once a parameter's values changed between two backwards
with no optimizer step in between (in-place updates through `.data` leave no version count, so a
few of its values are compared). Runs in the user's process (recorder.py); once decided it costs
nothing more.
"""

from __future__ import annotations

from typing import Any

NODES_WALKED = 100_000
"""The autograd graph is walked once, from the first loss, up to this many nodes, to find its parameters."""
VALUES_COMPARED = 64
CHECKS = 64
"""Backwards compared before giving up (a frozen model, or accumulation over more micro-batches than this)."""


def graph_leaves(loss: Any) -> list[Any]:
    """The leaf tensors a backward from `loss` accumulates gradients into (the trained parameters)."""
    stack, seen, leaves = [getattr(loss, "grad_fn", None)], set(), []
    while stack and len(seen) < NODES_WALKED:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node holds its leaf
        if variable is not None:
            leaves.append(variable)
        else:
            stack.extend(child for child, _ in node.next_functions)
    return leaves


class HandUpdates:
    """`before(loss)` at the start of each backward says True once the parameters are seen updated by hand;
    `after()` at its end keeps a few values of one parameter to compare at the next backward."""

    def __init__(self) -> None:
        self.parameters: list[Any] = []
        self.kept: Any = None
        self.checks = 0
        self.decided: bool | None = None
        """True: updated by hand; False: not (an optimizer stepped, or too many backwards without a change)."""

    def before(self, loss: Any) -> bool:
        if self.decided is not None:
            return bool(self.decided)
        if not self.parameters:
            self.parameters = graph_leaves(loss)
        elif self.kept is not None:
            import torch

            self.checks += 1
            if not torch.equal(self._values(), self.kept):
                self.decided = True
            elif self.checks >= CHECKS:
                self.decided = False
        return bool(self.decided)

    def after(self) -> None:
        if self.decided is None and self.parameters:
            self.kept = self._values().clone()

    def optimizer_stepped(self) -> None:
        self.decided, self.kept = False, None

    def _values(self) -> Any:
        return self.parameters[0].detach().reshape(-1)[:VALUES_COMPARED]

    def describe(self) -> dict[str, Any]:
        """The pseudo-optimizer entry of the report: what an optimizer's would say."""
        return {"class": "by hand (no optimizer)", "parameters": int(sum(p.numel() for p in self.parameters)), "tensors": len(self.parameters),
                "lr": None, "foreach": None, "fused": None, "at": None}
