"""Where a series splits into train, validation and test (`Split`, its checks and bounds) and where its windows start
(`window_layout`): plain arithmetic on lengths (numpy only), so the scheduler checks every project of a campaign
against its lookbacks without cutting a window or importing torch; `windows.make_windows` cuts them from the layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from gpufill.errors import InputError

if TYPE_CHECKING:
    from gpufill.forecasting.data.project import Project


@dataclass(frozen=True)
class Split:
    """Sizes of the validation and test regions, taken from the end of the series."""

    val: float | int = 0.1
    """float in [0, 1): fraction of the series; int >= 0: count of time steps before the test region."""
    test: float | int = 0.2
    """Same; e.g. test=18 holds out the last 18 points (competition style)."""
    backtest: tuple[int, int] | None = None
    """(windows, step): rolling origins instead of `test`: the last origin forecasts the last horizon, each
    earlier one `step` before it; the test region is (windows - 1) * step + horizon points."""


def is_count(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_split(split: Split) -> None:
    for field in ("val",) if split.backtest else ("val", "test"):
        value = getattr(split, field)
        if is_count(value):
            if value < 0:
                raise InputError(f"count {value} is negative",
                                 fix=f"set split.{field} to a count >= 0 or a fraction in [0, 1)", where="split", field=field)
        elif isinstance(value, (float, np.floating)):
            if not 0.0 <= value < 1.0:
                raise InputError(f"fraction {value} is outside [0, 1)",
                                 fix=f"set split.{field} to a fraction in [0, 1) or an integer count of time steps", where="split", field=field)
        else:
            raise InputError(f"{value!r} is neither a fraction nor a count",
                             fix=f"set split.{field} to a float in [0, 1) or an integer >= 0", where="split", field=field)
    fractions = [v for v in (split.val, split.test) if not is_count(v)]
    if len(fractions) == 2 and sum(fractions) >= 1.0 and not split.backtest:
        raise InputError(f"val + test fractions = {sum(fractions):g} leave nothing to train on",
                         fix="make split.val + split.test less than 1 (e.g. val=0.1, test=0.2)", where="split", field="val+test")


def count_of(value: float | int, length: int) -> int:
    # A fraction is rounded to the nearest whole step (0.2 of 2000 -> 400).
    return int(value) if is_count(value) else int(round(float(value) * length))


def test_size(split: Split, length: int, horizon: int) -> int:
    if split.backtest:
        windows, step = split.backtest
        return (windows - 1) * step + horizon
    return count_of(split.test, length)


def split_bounds(length: int, split: Split, horizon: int = 1) -> tuple[int, int]:
    """(train_end, val_end): train = [0, train_end), val = [train_end, val_end), test = [val_end, length)."""
    check_split(split)
    n_val, n_test = count_of(split.val, length), test_size(split, length, horizon)
    train_end = length - n_val - n_test
    if train_end < 1:
        raise InputError(f"a series of length {length} has no training region left after val={split.val} and test={split.test}",
                         fix="lower split.val / split.test or use a longer series", where="split", field="val+test")
    return train_end, length - n_test


def fits(length: int, lookback: int, horizon: int, split: Split, *, pad: bool = False) -> bool:
    """One training window and >= horizon val/test points; padded, the window needs one real input only."""
    n_val, n_test = count_of(split.val, length), test_size(split, length, horizon)
    train_end = length - n_val - n_test
    val_ok = n_val >= horizon if split.val else True
    return train_end >= (1 if pad else lookback) + horizon and n_test >= horizon and val_ok


def minimum_length(lookback: int, horizon: int, split: Split, *, pad: bool = False) -> int:
    """Shortest series that gives one train window and >= horizon test (and val) points."""
    check_split(split)
    lookback = 1 if pad else lookback  # padded, a window needs one real input
    # Analytic lower bound, then a short upward scan: rounding makes the exact bound jittery.
    # Each rounded fraction is at most f*T + 0.5, so train_end <= T*(1 - frac) - fixed + 0.5*n_frac.
    sizes = (split.val,) if split.backtest else (split.val, split.test)
    fixed = sum(int(v) for v in sizes if is_count(v)) + (test_size(split, 0, horizon) if split.backtest else 0)
    fractions = [float(v) for v in sizes if not is_count(v)]
    bound = (lookback + horizon + fixed - 0.5 * len(fractions)) / (1.0 - sum(fractions))
    for v in sizes:
        if not is_count(v) and v > 0:
            bound = max(bound, (horizon - 0.5) / float(v))
    length = max(1, int(bound) - 1)
    while not fits(length, lookback, horizon, split):
        length += 1
    return length


@dataclass(frozen=True)
class WindowLayout:
    """Where one project's windows start for a lookback, horizon, split and stride (`window_layout`)."""

    lookback: int
    horizon: int
    split: Split
    """As used: a padded series too short to validate trains on its whole history (val 0)."""
    shift: int
    """Steps of left padding (0: the series holds a full lookback before its first training target)."""
    train_end: int
    val_end: int
    train_t: np.ndarray
    """Each training window's first target step, in the series' own times (so for val_t and test_t)."""
    val_t: np.ndarray
    test_t: np.ndarray
    """Every test point (stride 1), or a backtest's rolling origins."""


def window_layout(project: Project, lookback: int, horizon: int, split: Split = Split(), stride: int = 1, *, pad: bool = False) -> WindowLayout:
    """The layout `make_windows` cuts, or one line naming what does not fit (`make_windows` says what each argument means)."""
    where = f"project {project.name} ({project.source})"
    _check_positive(where, lookback=lookback, horizon=horizon, stride=stride)
    lookback, horizon, stride = int(lookback), int(horizon), int(stride)
    check_split(split)
    if split.test == 0 and not split.backtest:
        raise InputError("split.test=0 leaves no test region",
                         fix=f"set split.test to a fraction in (0, 1) or a count >= horizon ({horizon})", where=where, field="split.test")
    for field in ("val",) if split.backtest else ("val", "test"):  # a count below horizon can never hold one window: no length fixes it
        value = getattr(split, field)
        if is_count(value) and 0 < value < horizon:
            raise InputError(f"split.{field}={value} is smaller than horizon={horizon}, so it holds no whole window",
                             fix=f"set split.{field} >= {horizon}" + (" or 0" if field == "val" else "") + " or lower horizon", where=where, field=f"split.{field}")
    length = project.length
    padded = pad and not fits(length, lookback, horizon, split)
    if pad and split.val and not fits(length, lookback, horizon, split, pad=True) and fits(length, lookback, horizon, replace(split, val=0), pad=True):
        # One model over many series validates on the others: this one keeps its history for training.
        split = replace(split, val=0)
    if not fits(length, lookback, horizon, split, pad=pad):
        need = minimum_length(lookback, horizon, split, pad=pad)
        needs = "one real input before its first training target" if pad else "one train window"
        raise InputError(
            f"series too short: length {length} < {need} needed for lookback={lookback}, horizon={horizon}, "
            f"split val={split.val} test={split.test} ({needs} and >= horizon val/test points)",
            fix="lower lookback or horizon, or the split sizes, or use a longer series",
            where=where,
            field="length",
        )
    train_end, val_end = split_bounds(length, split, horizon)
    shift = lookback - 1 if padded else 0
    # Target-start ranges per region: [first, region_end - horizon], in original times.
    train_t = _starts(max(1, lookback - shift), train_end - horizon, stride)
    val_t = _starts(train_end, val_end - horizon, stride)
    test_t = val_end + split.backtest[1] * np.arange(split.backtest[0], dtype=np.int64) if split.backtest else _starts(val_end, length - horizon, 1)
    return WindowLayout(lookback, horizon, split, shift, train_end, val_end, train_t, val_t, test_t)


def _check_positive(where: str, **values: object) -> None:
    for field, value in values.items():
        if not is_count(value) or value < 1:
            raise InputError(f"must be an integer >= 1, got {value!r}",
                             fix=f"set {field} to a positive integer", where=where, field=field)


def _starts(first: int, last: int, stride: int) -> np.ndarray:
    """Window start times in [first, last], thinned by stride, anchored at the most recent window."""
    if last < first:
        return np.zeros(0, dtype=np.int64)
    return np.arange(last, first - 1, -stride, dtype=np.int64)[::-1]
