"""Building blocks of the campaign spec models: the strict base model, the number types and their limits."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

from gpufill.errors import InputError

__all__ = ["Count", "Float", "Spec", "at_most", "digits"]

SCIENTIFIC = re.compile(r"^[+-]?\d+(\.\d*)?[eE][+-]?\d+$")


def _number(value: Any) -> Any:
    # pydantic's lax float takes true as 1.0; a bool where a number belongs is a mistake.
    # Strings are left to pydantic: YAML reads 1e-3 (no dot) as the string "1e-3".
    if isinstance(value, bool):
        raise InputError(f"expected a number, got {value!r}", fix="write a number such as 0.001")
    return value


def digits(value: Any) -> Any:
    # YAML 1.1 reads 1e8 (no dot, no exponent sign) as the text "1e8": say so, instead of "expected an integer, got '1e8'".
    if isinstance(value, str) and SCIENTIFIC.match(value.strip()):
        number = float(value)
        shown = f"{int(number)}" if number.is_integer() and abs(number) < 1e18 else "digits"
        raise InputError(f"{value!r} is text to YAML, not a count", fix=f"write the count in digits ({shown})")
    return value


def at_most(limit: int, why: str) -> AfterValidator:
    """A count's upper limit, refused up front with the limit named: sizes that would take minutes or all the memory."""

    def check(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise InputError(f"{value:,} is more than the {limit:,} gpufill allows ({why})", fix=f"use at most {limit:,}")
        return value

    return AfterValidator(check)


Float = Annotated[float, BeforeValidator(_number)]
Count = Annotated[StrictInt, BeforeValidator(digits), Field(ge=1)]


class Spec(BaseModel):
    """Base of the spec models: unknown keys are errors, and a loaded spec never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
