"""Command-line values typer cannot parse alone: auto|N, on|off, split sizes, KEY=VALUE params, slots."""

from __future__ import annotations

from typing import Any

from gpufill.errors import InputError


def parse_auto_int(value: str, option: str) -> int | str:
    """"auto" or a positive integer."""
    if value == "auto":
        return "auto"
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise InputError(f"expected a positive integer or auto, got {value!r}", where="command line", field=option, fix=f"pass e.g. {option} 128 or {option} auto")
    return number


def parse_switch(value: str, option: str) -> bool | str:
    """"auto", "on" or "off"."""
    choices = {"auto": "auto", "on": True, "off": False, "true": True, "false": False}
    if value.lower() not in choices:
        raise InputError(f"expected auto, on or off, got {value!r}", where="command line", field=option, fix=f"pass {option} auto|on|off")
    return choices[value.lower()]


def parse_split_size(value: str, option: str) -> float | int:
    """A fraction in [0, 1) such as 0.2, or a count of final time steps such as 18."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0 or (number >= 1 and not number.is_integer()):
        raise InputError(f"expected a fraction in [0, 1) or a whole count of time steps, got {value!r}", where="command line", field=option, fix=f"pass e.g. {option} 0.2 or {option} 18")
    return int(number) if number >= 1 else number


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; values are read as YAML scalars (128 -> int, 1e-3 -> float, true -> bool)."""
    import yaml  # here: every command imports this module, few read --param (status and results never)

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InputError(f"expected KEY=VALUE, got {pair!r}", where="command line", field="--param", fix="pass e.g. --param hidden_size=128")
        params[key.strip()] = yaml.safe_load(raw)
    return params


def parse_slots(value: str | None, option: str) -> int | str | None:
    return None if value is None else parse_auto_int(value, option)


