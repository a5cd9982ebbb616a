"""Parameter checks shared by the neural and classical families: one wording for every model error."""

from __future__ import annotations

import numbers

from gpufill.errors import InputError


def whole_number(family: str, name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InputError(f"{name} must be a whole number >= {minimum}, got {value!r}",
                         fix=f"set {name} to an int >= {minimum}", field=f"{family}.{name}")
    return int(value)


def window_dims(family: str, n_features: object, lookback: object, horizon: object, last_value_norm: object, *, norm_meaning: str) -> tuple[int, int, int, bool]:
    """(n_features, lookback, horizon, last_value_norm), checked; `norm_meaning` says what true means for this kind."""
    dims = tuple(whole_number(family, name, value) for name, value in (("n_features", n_features), ("lookback", lookback), ("horizon", horizon)))
    if not isinstance(last_value_norm, bool):
        raise InputError(f"last_value_norm must be true or false, got {last_value_norm!r}",
                         fix=f"set last_value_norm to true ({norm_meaning}) or false", field=f"{family}.last_value_norm")
    return (*dims, last_value_norm)  # type: ignore[return-value]
