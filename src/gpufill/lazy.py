"""Packages whose names load on first use: importing a package (or one of its submodules) imports none of the others,
so a process that needs no torch, pandas or scikit-learn never pays for them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def by_home(groups: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """name -> submodule, from each submodule and the names it defines (the way a reader looks them up)."""
    return {name: home for home, names in groups.items() for name in names}


def lazy_names(package: str, home: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: each name in `home` (name -> the submodule defining it, relative to
    `package`) is imported when first read, then kept in the package's namespace."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        namespace[name] = value  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    return __getattr__, __dir__
