"""A stream that never ends, caught before training: an `IterableDataset` whose `__iter__` loops
forever, given with neither `steps_per_epoch` nor `max_steps`, would train its first epoch for
ever with nothing to show (an epoch of a stream is one pass, counted as it goes).

A stream's length cannot be known without reading it, so this reads its code instead: a
`while True:` (or `itertools.count/cycle/repeat`) loop that yields, with no `break` or `return`
in it, never ends. Streams whose end the code does not show are trained as one pass per epoch.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from gpufill.errors import InputError

ENDLESS_ITERATORS = frozenset({"count", "cycle", "repeat"})


def endless_loop_at(dataset: Any) -> str | None:
    """file:line of a loop in `type(dataset).__iter__` that yields and has no way out (None: none seen, or no source)."""
    method = getattr(type(dataset), "__iter__", None)
    try:
        lines, first = inspect.getsourcelines(method)  # type: ignore[arg-type]
        tree = ast.parse(textwrap.dedent("".join(lines)))
        path = inspect.getsourcefile(method)  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return None
    for node in _own_body(tree):
        if _forever(node) and _yields(node) and not _leaves(node):
            return f"{path}:{first + node.lineno - 1}"
    return None


def _own_body(tree: ast.Module) -> list[ast.AST]:
    """The nodes of `__iter__` itself: not those of a function, lambda or class defined inside it (a nested
    endless generator that `__iter__` only slices, `islice(forever(), n)`, is its own business)."""
    method = tree.body[0] if tree.body and isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef) else None
    stack: list[ast.AST] = list(method.body) if method is not None else list(tree.body)
    nodes = []
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        nodes.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def _forever(node: ast.AST) -> bool:
    if isinstance(node, ast.While):
        return isinstance(node.test, ast.Constant) and bool(node.test.value)
    if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
        func = node.iter.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in ENDLESS_ITERATORS and not (name == "repeat" and len(node.iter.args) > 1)  # repeat(x, n) ends
    return False


def _yields(loop: ast.AST) -> bool:
    return any(isinstance(node, ast.Yield | ast.YieldFrom) for node in ast.walk(loop))


def _leaves(loop: ast.While | ast.For) -> bool:
    """A return anywhere in the loop, or a break of this loop (not of a loop nested in it)."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return | ast.Raise):
            return True
        if isinstance(node, ast.Break):
            return True
        if isinstance(node, ast.While | ast.For):
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Return | ast.Raise))  # a nested loop's break leaves only it
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def check_stream_ends(data: Any, *, steps_per_epoch: int | None, max_steps: int | None, name: str = "train") -> None:
    """Refuse, in one line, an endless stream that no setting bounds. A given DataLoader is used as it is (an epoch
    is its pass: steps_per_epoch does not cut it), so only max_steps bounds one; validation reads its data to the end."""
    given_loader = isinstance(data, DataLoader)
    dataset = data.dataset if given_loader else data
    if not isinstance(dataset, IterableDataset):
        return
    if name == "train" and (max_steps is not None or (steps_per_epoch is not None and not given_loader)):
        return
    at = endless_loop_at(dataset)
    if at is None:
        return
    problem = f"{type(dataset).__name__}.__iter__ loops forever (at {at}), so "
    if name != "train":
        raise InputError(problem + "validation, which reads its data to the end, would never end", field=name,
                         fix="give validation data that ends (a finite IterableDataset, a Dataset or tensors)")
    fix = "set max_steps=N (optimizer steps in all), or pass the IterableDataset itself with steps_per_epoch=N" if given_loader else \
        "set steps_per_epoch=N (optimizer steps per epoch) or max_steps=N (in all)"
    raise InputError(problem + "an epoch of it never ends", field=name, fix=fix)
