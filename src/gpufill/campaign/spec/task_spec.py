"""The campaign file's `task:` section: what to forecast (lookbacks, horizon, scaling), the validation and test
regions (or a backtest's rolling origins), and how trials are ranked."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictInt, field_validator, model_validator

from gpufill.campaign.spec.spec_errors import LocatedError, first_duplicate
from gpufill.campaign.spec.spec_types import Count, Float, Spec
from gpufill.errors import InputError
from gpufill.forecasting.data import Split
from gpufill.forecasting.data.scalings import ScalingName
from gpufill.forecasting.trial import METRICS


class RollingOrigins(Spec):
    windows: Count
    """How many forecast origins (each scored on its horizon)."""
    step: Count
    """Time steps between two origins."""


class BacktestSpec(Spec):
    """`test: {backtest: {windows: 3, step: 6}}`: the last origin forecasts the series' last horizon, each
    earlier one `step` before it; one training per trial, scored at every origin (metrics: their mean)."""

    backtest: RollingOrigins


class SplitSpec(Spec):
    """Validation and test regions at the end of each series: a fraction in [0, 1) or a count; the test
    region may be a backtest's rolling origins instead."""

    val: StrictInt | Float = 0.1
    test: StrictInt | Float | BacktestSpec = 0.2
    """Must hold test points: the campaign ranks trials on them."""

    @field_validator("val", "test")
    @classmethod
    def _check_size(cls, value: int | float | BacktestSpec) -> int | float | BacktestSpec:
        if isinstance(value, int) and value < 0:
            raise InputError(f"count {value} is negative", fix="give a count >= 0 or a fraction in [0, 1)")
        if isinstance(value, float) and not 0.0 <= value < 1.0:
            raise InputError(f"fraction {value} is outside [0, 1)", fix="give a fraction in [0, 1) or an integer count of time steps")
        return value

    @model_validator(mode="after")
    def _check_total(self) -> SplitSpec:
        if self.test == 0:
            raise LocatedError(("test",), "test=0 leaves nothing to score trials on", fix="set test to a fraction in (0, 1) or a count >= horizon")
        fractions = [v for v in (self.val, self.test) if isinstance(v, float)]
        if len(fractions) == 2 and sum(fractions) >= 1.0:
            raise LocatedError(("val",), f"val + test = {sum(fractions):g} leaves nothing to train on", fix="make val + test less than 1 (e.g. val 0.1, test 0.2)")
        return self

    def to_split(self) -> Split:
        if isinstance(self.test, BacktestSpec):
            return Split(val=self.val, test=0, backtest=(self.test.backtest.windows, self.test.backtest.step))
        return Split(val=self.val, test=self.test)


class TaskSpec(Spec):
    """What to forecast and how trials are scored."""

    lookback: list[Count] = [30]
    """Input window lengths, a grid axis (a single number is a one-item list)."""
    horizon: Count = 1
    split: SplitSpec = SplitSpec()
    metric: Literal[tuple(METRICS)] = "mae"  # type: ignore[valid-type]  # the names of METRICS (forecasting/metric_registry.py)
    """Ranks results only; it never changes what is trained."""
    mode: Literal["local", "global"] = "local"
    """local: one model per project; global: one model over all projects."""
    stride: Count = 1
    """Step between training windows."""
    scaling: Literal["auto", ScalingName] = "auto"
    """How each window's target is scaled (forecasting.data.window_scaling); auto: the family's recipe (forecasting.recipes)."""

    @field_validator("lookback", mode="before")
    @classmethod
    def _one_lookback(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("lookback")
    @classmethod
    def _check_lookbacks(cls, value: list[int]) -> list[int]:
        if not value:
            raise InputError("no lookback given", fix="give at least one window length, e.g. lookback: [30]")
        seen = first_duplicate(value)
        if seen is not None:
            raise LocatedError((seen,), f"lookback {value[seen]} is listed twice", fix="list each lookback once")
        return value
