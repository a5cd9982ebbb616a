"""Building blocks of the campaign spec models: the strict base model and the number types."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

from gpufill.errors import InputError

__all__ = ["Count", "Float", "Spec"]


def _number(value: Any) -> Any:
    # pydantic's lax float takes true as 1.0; a bool where a number belongs is a mistake.
    # Strings are left to pydantic: YAML reads 1e-3 (no dot) as the string "1e-3".
    if isinstance(value, bool):
        raise InputError(f"expected a number, got {value!r}", fix="write a number such as 0.001")
    return value


Float = Annotated[float, BeforeValidator(_number)]
Count = Annotated[StrictInt, Field(ge=1)]


class Spec(BaseModel):
    """Base of the spec models: unknown keys are errors, and a loaded spec never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
