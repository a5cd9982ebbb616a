"""Choice: one planned setting and the reason it was chosen (the unit every plan is made of)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Choice(Generic[T]):
    """One planned setting: its value and why."""

    value: T
    reason: str
