"""From the campaign YAML to InputErrors that name ``file:line``.

:func:`read_yaml` reads and parses the file, :func:`line_index` finds the line of every key
and sequence item, and :func:`to_input_error` turns pydantic's ValidationError into one
InputError with the file, line, dotted field, problem and fix. :class:`LocatedError`,
:func:`first_duplicate` and :func:`show` are shared with the spec models and the grid checks.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from gpufill.errors import InputError
from gpufill.files import open_input

__all__ = [
    "LocatedError",
    "allowed_keys",
    "dotted",
    "explain",
    "first_duplicate",
    "line_index",
    "line_of",
    "read_yaml",
    "show",
    "to_input_error",
]


class LocatedError(InputError):
    """An InputError raised inside validation that knows the keys below where pydantic saw it."""

    def __init__(self, loc: tuple[str | int, ...], problem: str, *, fix: str):
        self.loc = loc
        super().__init__(problem, fix=fix, field=dotted(loc) or None)


def dotted(loc: Iterable[str | int]) -> str:
    """models.lstm.hidden_size: list indices are left out (the line points at the item)."""
    return ".".join(str(part) for part in loc if not isinstance(part, int))


# --- reading the file --------------------------------------------------------------------------


MAX_VALUES = 1_000_000
"""A campaign file expands (aliases followed) to at most this many YAML values; real ones have hundreds."""
MAX_DEPTH = 100
"""Levels of nesting a campaign file may have (real ones nest a few: models: family: parameter: [values]). Counted on
the tokens before PyYAML's composer, which recurses once per level: how deep a file may nest must not depend on
Python's recursion limit, which some imports raise (1,000 levels loaded after `import torch._dynamo`)."""
MAX_BYTES = 4 * 1024 * 1024
"""A campaign file is read up to this size (real ones are a few KB; a list of 100,000 project names is ~1.5 MB):
`/dev/zero`, a log file or a dataset passed by mistake is refused after reading this much, not read into memory."""


def expanded_size(root: yaml.Node | None) -> int:
    """How many values the node tree holds with every alias expanded, counted in time linear in the
    distinct nodes (a shared node's size is computed once), stopping early past MAX_VALUES."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                break
        sizes[id(node)] = total
        return total

    return 0 if root is None else size(root)


def _check_size(root: yaml.Node | None, path: Path) -> None:
    try:
        expanded = expanded_size(root)
    except RecursionError:
        expanded = MAX_VALUES + 1  # nested deeper than Python's recursion limit: no real campaign is
    if expanded > MAX_VALUES:
        raise InputError(f"its values, aliases expanded, number more than {MAX_VALUES:,} (nested *references to &anchors, or nesting too deep)",
                         where=str(path), fix="write the campaign without nested aliases; a grid is a list per parameter, expanded by gpufill")


_OPENS = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken, yaml.BlockSequenceStartToken, yaml.BlockMappingStartToken)
_CLOSES = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)


def _nesting_too_deep(text: str) -> bool:
    """More than MAX_DEPTH levels of collections, counted on the scanner's tokens (the scanner does not recurse)."""
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif isinstance(token, _CLOSES):
            depth -= 1
    return False


def _too_deep(path: Path) -> InputError:
    return InputError("nesting too deep: values nested more levels deep than the YAML reader can follow", where=str(path),
                      fix="flatten the file: a campaign nests a few levels (models: family: parameter: [values])")


def read_yaml(path: Path) -> tuple[yaml.Node, dict[str, Any]]:
    """The file's node tree (for lines) and its values, a mapping; any problem is an InputError."""
    try:
        # A FIFO is refused, not waited on; at most MAX_BYTES + 1: an endless or huge file is never read whole.
        with os.fdopen(open_input(path, field="campaign file"), "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise InputError(f"the file is larger than the {MAX_BYTES // (1024 * 1024)} MiB a campaign file may be", where=str(path),
                             fix="point to the campaign's .yaml file (a campaign is a few KB; list projects with a glob, not one by one)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise InputError("campaign file not found", fix="check the path (relative paths are from the current directory)", where=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a campaign file", fix="point to the campaign's .yaml file", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the file ({type(exc).__name__}: {exc})", fix="check the file's permissions and that it is UTF-8 text", where=str(path)) from None
    try:
        if _nesting_too_deep(text):
            raise _too_deep(path)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_size(root, path)  # before anything walks the values: a few hundred bytes of aliases can expand to billions
        data = yaml.safe_load(text)
    except RecursionError:  # PyYAML's composer recurses once per level (checked above; a low recursion limit is still caught)
        raise _too_deep(path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if "<stream end>" in str(getattr(exc, "problem", "")) and getattr(exc, "context_mark", None) is not None:
            mark = exc.context_mark  # an unclosed bracket: point at where it opened, not at the end of the file
        line = mark.line + 1 if mark is not None else 1
        problem = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part) or str(exc)
        context = getattr(exc, "context_mark", None)
        opened = f" (what it parses began at line {context.line + 1})" if context is not None and context.line + 1 != line else ""
        raise InputError(
            f"not valid YAML: {problem}{opened}",
            fix=f"fix the YAML syntax at line {line} (indentation, a missing ':' or an unclosed quote or bracket)",
            where=f"{path}:{line}",
        ) from None
    if root is None:
        raise InputError("the file is empty", fix="write a campaign: name, models, and optionally data, task, train, seeds, resources", where=f"{path}:1")
    if not isinstance(data, dict):
        raise InputError(
            f"the top level is a {type(data).__name__}, not a mapping of keys",
            fix="start the file with keys such as 'name: my_campaign' and 'models:'",
            where=f"{path}:{root.start_mark.line + 1}",
        )
    return root, data


# --- lines -------------------------------------------------------------------------------------


def line_index(root: yaml.Node, where: str) -> dict[tuple[str | int, ...], int]:
    """1-based line of every key and sequence item, by path; a duplicate key is an error."""
    lines: dict[tuple[str | int, ...], int] = {(): root.start_mark.line + 1}

    def walk(node: yaml.Node, prefix: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                path = (*prefix, key_node.value)
                line = key_node.start_mark.line + 1
                if path in lines:
                    raise InputError(f"duplicate key {key_node.value!r} (also at line {lines[path]})",
                                     fix="keep one of them: YAML would silently use only the last", where=f"{where}:{line}", field=".".join(map(str, path)))
                lines[path] = line
                walk(value_node, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*prefix, i)] = item.start_mark.line + 1
                walk(item, (*prefix, i))

    walk(root, ())
    return lines


def line_of(loc: Iterable[str | int], lines: Mapping[tuple[str | int, ...], int]) -> tuple[tuple[str | int, ...], int]:
    """(the parts of loc present in the file, the line of the deepest one).

    Parts not in the file are skipped: pydantic's union tags ('int', "literal['auto']"),
    a key that is missing, or an index into a scalar that became a one-item list.
    """
    path: tuple[str | int, ...] = ()
    for part in loc:
        for candidate in ((*path, part), (*path, str(part))):
            if candidate in lines:
                path = candidate
                break
    return path, lines[path]


# --- pydantic errors -> InputError ---------------------------------------------------------------


def to_input_error(exc: ValidationError, lines: Mapping[tuple[str | int, ...], int], where: str, root: type[BaseModel]) -> InputError:
    """The first problem in file order (an unknown key before a missing one) as an InputError.

    ``root`` is the model the file validates against (CampaignSpec): it names the allowed keys.
    """
    found = []
    for order, err in enumerate(exc.errors()):
        cause = (err.get("ctx") or {}).get("error")
        loc = tuple(err["loc"]) + tuple(getattr(cause, "loc", ()))
        path, line = line_of(loc, lines)
        if err["type"] == "missing":
            path = (*path, loc[-1])
        found.append((err["type"] == "missing", line, order, path, err))
    missing, line, _, path, first = min(found, key=lambda item: item[:3])
    field = dotted(path)
    if first["type"] == "missing":
        parent = f"under {'.'.join(map(str, path[:-1]))}" if len(path) > 1 else "at the top level"
        problem, fix = f"missing required key {path[-1]!r}", f"add '{path[-1]}:' {parent}"
    elif first["type"] == "extra_forbidden":
        key = str(path[-1])
        allowed = allowed_keys(root, path[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problem, fix = f"unknown key {key!r}", f"{hint}allowed keys here: {', '.join(allowed)}"
    else:
        group = [item[4] for item in found if item[3] == path and not item[0]]
        problem, fix = explain(group, field)
        if path[:1] == ("models",) and first["type"] == "dict_type":
            example = "{lstm: {hidden_size: [64, 128]}}" if len(path) == 1 else "{hidden_size: [64, 128], num_layers: 2}"
            fix = f"write {field} as a mapping, e.g. {example} (a list is a grid axis, a scalar a fixed value)"
    return InputError(problem, fix=fix, where=f"{where}:{line}", field=field or None)


def explain(errors: list[dict[str, Any]], field: str) -> tuple[str, str]:
    """(problem, fix) for the errors pydantic raised on one value (several: one per union member)."""
    for err in errors:
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, InputError):
            return cause.problem, cause.fix
        if err["type"] == "invalid_key":
            return f"key {show(err.get('input'))} is not a name", "write the key as a name (quote a number: '1':)"
        if err["type"] == "value_error":
            return str(cause or err["msg"]), f"correct {field}"
    wanted = list(dict.fromkeys(_expected(err) for err in errors))
    expected = " or ".join(wanted)
    return f"expected {expected}, got {show(errors[0].get('input'))}", f"set {field} to {expected}"


def _expected(err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    for name, op in bounds.items():
        if kind == name:
            return f"a value {op} {next(iter(ctx.values()))}"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        return f"one of {expected}" if "," in expected or " or " in expected else expected
    names = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "string": "a string",
        "list": "a list",
        "dict": "a mapping",
        "model": "a mapping",
        "none": "null",
    }
    prefix = kind.split("_")[0]
    return names.get(prefix, err["msg"].removeprefix("Input should be "))


def allowed_keys(root: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """Keys allowed in the mapping at ``loc`` (field names of the model found there below ``root``)."""
    model: type[BaseModel] | None = root
    for part in loc:
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is not None:
            model = _model_in(field.annotation)
    if model is None:
        return []
    return [name for name in model.model_fields if not (model is root and name == "path")]  # path: set from where the file is


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# --- helpers shared with the checks ------------------------------------------------------------


def first_duplicate(values: list[Any]) -> int | None:
    """Index of the first value equal to an earlier one (1 == 1.0 counts; True is not 1), or None.

    Linear: hashable values go through a set (300,000 seeds check in milliseconds); only
    unhashable ones (lists) are compared pairwise, among themselves."""
    seen: set[tuple[bool, Any]] = set()
    unhashable: list[Any] = []
    for i, value in enumerate(values):
        try:
            key = (isinstance(value, bool), value)
            if key in seen:
                return i
            seen.add(key)
        except TypeError:
            if any(_same(value, earlier) for earlier in unhashable):
                return i
            unhashable.append(value)
    return None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)
    except Exception:  # values whose == is not a bool (arrays): never duplicates
        return False


def show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
