"""Synthetic projects: seasonal series with trend, level shifts and informative covariates.

Built so that a model with a 30-step lookback clearly beats the naive last-value
forecast: the seasonal swing is several times larger than the noise.

A project's fingerprint is its recipe (GENERATOR_VERSION, seed, index, length, covariates), not its values:
the values go through np.exp, np.sin and np.convolve (BLAS), whose last bits depend on the CPU.
"""

from __future__ import annotations

import numpy as np

from gpufill.forecasting.data.project import Project, recipe_fingerprint
from gpufill.errors import InputError

GENERATOR_VERSION = 1
"""Part of every synthetic project's fingerprint, so of its trials' ids: bump it with any change to what
the generator draws (tests/forecasting/test_data_synthetic.py holds what each version draws and says so)."""

# Covariate names, in the order they are exposed (n_covariates takes a prefix).
_DRIVER_NAMES = ("leading_indicator", "periodic_driver")
_AR_TAIL = 256  # AR(1) impulse response is truncated here: phi**256 < 1e-24 for phi <= 0.8


def _ar1(rng: np.random.Generator, length: int, phi: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) noise, vectorised as a convolution with phi**k (no Python loop)."""
    shocks = rng.normal(0.0, sigma, size=length + _AR_TAIL)
    kernel = phi ** np.arange(_AR_TAIL)
    # drop the first _AR_TAIL outputs: the burn-in, so the series starts stationary
    return np.convolve(shocks, kernel)[_AR_TAIL : _AR_TAIL + length]


def _one_project(name: str, rng: np.random.Generator, length: int, n_covariates: int, origin: str) -> Project:
    t = np.arange(length, dtype=np.float64)
    level = float(np.exp(rng.uniform(np.log(50.0), np.log(500.0))))  # log-uniform 50..500

    # Trend: piecewise-linear, continuous, slope changes once; total drift bounded to +-25 %.
    change = int(rng.uniform(0.3, 0.7) * length)
    slope_1, slope_2 = rng.uniform(-0.25, 0.25, size=2) * level / length
    trend = slope_1 * t + (slope_2 - slope_1) * np.maximum(t - change, 0.0)

    # Seasonalities: weekly and monthly always, yearly for about half the projects.
    periods = [7.0, 30.4, 365.25]
    amplitudes = level * np.array([rng.uniform(0.08, 0.15), rng.uniform(0.04, 0.10), rng.uniform(0.02, 0.08)])
    phases = rng.uniform(0.0, 2 * np.pi, size=3)
    if rng.random() < 0.5:
        amplitudes[2] = 0.0
    season = sum(a * np.sin(2 * np.pi * t / p + ph) for a, p, ph in zip(amplitudes, periods, phases))

    # One or two level shifts (steps) at random times away from the edges.
    n_shifts = int(rng.integers(1, 3))
    times = rng.uniform(0.1, 0.9, size=n_shifts) * length
    sizes = rng.choice([-1.0, 1.0], size=n_shifts) * rng.uniform(0.05, 0.15, size=n_shifts) * level
    shifts = (sizes[None, :] * (t[:, None] >= times[None, :])).sum(axis=1)

    # Leading indicator: smooth AR(1) whose value at t moves the target at t+1.
    leading = _ar1(rng, length, phi=0.8, sigma=0.6)  # unit-ish variance
    lead_effect = np.zeros(length)
    lead_effect[1:] = rng.uniform(0.03, 0.06) * level * leading[:-1]
    # Periodic driver: a known schedule (3 "promotion" days every 14) that lifts the target the same day.
    promo_phase = int(rng.integers(0, 14))
    promo = (((t + promo_phase) % 14) < 3).astype(np.float64)
    promo_effect = rng.uniform(0.05, 0.10) * level * promo

    noise = _ar1(rng, length, phi=float(rng.uniform(0.3, 0.7)), sigma=0.015 * level)
    target = level + trend + season + shifts + lead_effect + promo_effect + noise

    # Extra covariates beyond the two drivers are uninformative random walks (distractors),
    # drawn last so that the target does not depend on n_covariates.
    drivers = np.column_stack([leading, promo])[:, : min(n_covariates, 2)]
    extra = np.cumsum(rng.normal(size=(length, max(n_covariates - 2, 0))), axis=0)
    covariates = np.ascontiguousarray(np.column_stack([drivers, extra]), dtype=np.float64)
    names = _DRIVER_NAMES[: min(n_covariates, 2)] + tuple(f"random_walk_{i}" for i in range(2, n_covariates))
    return Project(name=name, target=target, covariates=covariates, covariate_names=names, source="synthetic", origin=origin)


def synthetic_projects(
    n_projects: int = 10, length: int = 2000, seed: int = 0, n_covariates: int = 2
) -> dict[str, Project]:
    """``n_projects`` deterministic synthetic projects named p000, p001, ...

    Project i draws from a generator seeded with (seed, i), so it is the same whatever
    ``n_projects`` is.
    """
    checks = {"n_projects": (n_projects, 1), "length": (length, 2), "n_covariates": (n_covariates, 0), "seed": (seed, 0)}
    for field, (value, minimum) in checks.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise InputError(f"must be an integer >= {minimum}, got {value!r}",
                             fix=f"set {field} to an integer >= {minimum}", where="synthetic data", field=field)
    width = max(3, len(str(n_projects - 1)))
    out = {}
    for i in range(n_projects):  # one loop per project, not per row
        name = f"p{i:0{width}d}"
        origin = recipe_fingerprint("gpufill.synthetic", GENERATOR_VERSION, seed=int(seed), index=i, length=int(length), n_covariates=int(n_covariates))
        out[name] = _one_project(name, np.random.default_rng([int(seed), i]), int(length), int(n_covariates), origin)
    return out
