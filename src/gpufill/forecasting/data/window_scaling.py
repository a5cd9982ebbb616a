"""Per-window scaling of the target: each window's inputs set its own location and scale.

Windows come out of `make_windows` standard-scaled per project (fitted on the train region).
A global model over series of very different levels, or a series whose level drifts, often
learns better from windows scaled by their own inputs, as neural forecasters do:

- ``project``: the project's standard scaling only (no per-window step).
- ``last``: subtract the window's last input value (NLinear): the model sees the path relative
  to where it ends, in the project's units.
- ``mean``: divide by the window's mean absolute input (DeepAR's mean scaling): level-free and
  the origin stays at zero, so an sMAPE loss on scaled values is the sMAPE of the forecast.
- ``standard``: subtract the window's mean, divide by its standard deviation (RevIN, PatchTST).
- ``raw``: no scaling at all, the target in its own units (neuralforecast's default, `scaler_type="identity"`): the
  model sees each series' level, and a loss weighs each window by it (an absolute error of 10 on a series at 10,000
  counts as much as one on a series at 100).

Only the target (feature 0) is rescaled; covariates keep the project's scaling. Statistics use
real inputs only (a padded window's padding is left out and stays 0). A zero scale (a flat
window) falls back to the project's. Predictions come back through `WindowedProject.inverse_target`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gpufill.forecasting.data.project import recipe_fingerprint
from gpufill.forecasting.data.scalings import SCALINGS, ScalingName
from gpufill.forecasting.data.windows import WindowedProject, WindowScaling

__all__ = ["SCALINGS", "ScalingName", "scale_windows"]

REGIONS = ("train", "val", "test")


def scale_windows(windows: WindowedProject, how: str) -> WindowedProject:
    """`windows` with each window's target scaled by `how` (the same object for ``project``)."""
    if how not in SCALINGS:
        raise ValueError(f"unknown scaling {how!r}; known: {', '.join(SCALINGS)}")
    if how == "project":
        return windows
    padding = windows.padding
    mean0, std0 = float(windows.scaler.mean[0]), float(windows.scaler.std[0])
    # The three regions scaled as one array (each window's statistics are its own row's), then split back: a third
    # of the calls for the thousands of short series a global campaign scales.
    xs = [getattr(windows, f"x_{region}") for region in REGIONS]
    reals = [getattr(padding, f"real_{region}") if padding is not None else np.full(x.shape[0], windows.lookback) for region, x in zip(REGIONS, xs, strict=True)]
    sizes = [x.shape[0] for x in xs]
    scaled_x, scaled_y, (loc, scale) = _scale_region(torch.cat(xs), torch.cat([getattr(windows, f"y_{region}") for region in REGIONS]),
                                                     np.concatenate(reals), how, mean0, std0)
    cuts = np.cumsum(sizes)[:-1]
    parts = zip(REGIONS, scaled_x.split(sizes), scaled_y.split(sizes), np.split(loc, cuts), np.split(scale, cuts), strict=True)
    changed, stats = {}, {}
    for region, x, y, region_loc, region_scale in parts:
        changed[f"x_{region}"], changed[f"y_{region}"], stats[region] = x, y, (region_loc, region_scale)
    scaling = WindowScaling(how, **stats)
    data_id = recipe_fingerprint("gpufill.window_scaling", 1, windows=windows.data_id, how=how) if windows.data_id else ""
    return dataclasses.replace(windows, window_scaling=scaling, data_id=data_id, **changed)


def _scale_region(x: torch.Tensor, y: torch.Tensor, real: np.ndarray, how: str, mean0: float, std0: float):
    n, lookback = x.shape[0], x.shape[1]
    if n == 0:
        empty = np.zeros((0, 1))
        return x, y, (empty, empty)
    raw_x = x[:, :, 0].double().numpy() * std0 + mean0  # (N, lookback) the target's inputs, original scale
    raw_y = y.double().numpy() * std0 + mean0
    is_real = np.arange(lookback)[None, :] >= (lookback - np.asarray(real))[:, None]  # padding sits at the start
    count = is_real.sum(axis=1, keepdims=True)
    if how == "last":
        loc, scale = raw_x[:, -1:], np.full((n, 1), std0)
    elif how == "raw":  # the project's standard scaling undone: loc 0, scale 1
        loc, scale = np.zeros((n, 1)), np.ones((n, 1))
    elif how == "mean":
        loc = np.zeros((n, 1))
        scale = np.where(is_real, np.abs(raw_x), 0.0).sum(axis=1, keepdims=True) / count
    else:  # standard
        loc = np.where(is_real, raw_x, 0.0).sum(axis=1, keepdims=True) / count
        scale = np.sqrt(np.where(is_real, (raw_x - loc) ** 2, 0.0).sum(axis=1, keepdims=True) / count)
    if how != "raw":  # a flat window: the project's scale
        scale = np.where(scale > 1e-12 * max(1.0, abs(mean0)), scale, std0)
    scaled_x = x.clone()
    scaled_x[:, :, 0] = torch.from_numpy(np.where(is_real, (raw_x - loc) / scale, 0.0).astype(np.float32))
    scaled_y = torch.from_numpy(((raw_y - loc) / scale).astype(np.float32))
    return scaled_x, scaled_y, (loc, scale)
