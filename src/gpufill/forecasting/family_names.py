"""Family names as a campaign writes them: a built-in family (`nbeats`), a variant of one (`nbeats@mean`) or a user's
`package.module:factory`. Only strings here (no model is imported), so light modules (recipes, results) read names too.

A variant is the family under a second name: a campaign lists one family twice, with two grids that cannot be one
(sMAPE under mean scaling beside MAE under standard scaling); each variant keeps its own trials, rows and members.
"""

from __future__ import annotations

import re

__all__ = ["VARIANT", "base_name", "built_in", "valid_tag"]

VARIANT = "@"
_TAG = re.compile(r"[A-Za-z0-9_.-]+")


def base_name(name: str) -> str:
    """The family a name builds: `nbeats` for `nbeats@mean`, the name itself otherwise (a module path too)."""
    return name.rpartition(VARIANT)[0] if VARIANT in name and ":" not in name else name


def valid_tag(tag: str) -> bool:
    """A variant's tag: letters, digits, '_', '.' and '-'."""
    return _TAG.fullmatch(tag) is not None


def built_in(kind: str | None = None, *, references: bool | None = None) -> list[str]:
    """The built-in families (of `kind`: "neural" or "classical"), from the generated catalogue (nothing imported):
    what help lines and messages list. `references`: only the statistical references (True: they fit each series
    themselves), or none of them (False)."""
    from gpufill.forecasting.models.catalog import BUILT_IN

    neural_first = sorted(BUILT_IN, key=lambda name: (BUILT_IN[name]["kind"] != "neural", BUILT_IN[name]["fits_series"], name))
    return [name for name in neural_first if (kind is None or BUILT_IN[name]["kind"] == kind)
            and (references is None or BUILT_IN[name]["fits_series"] == references)]
