"""One chosen trial trained on all of its data, and its forecast past the end: torch's side of `gpufill forecast`.

The trial is the campaign's (its family, parameters, training settings, lookback and seed: the same initial weights),
cut as forecasting/data/future.py says (every real value trains; the one test window is the future), with the refit's
rule for a network's length: the epochs the campaign's early stopping chose (`fit_best_epoch`), or every epoch it
trained where nothing was chosen. So a campaign with `train.refit`, forecasting the series with their last horizon cut
off, gives back its own test forecasts (tests/campaign/future/test_future.py). A classical or statistical family trains
as the campaign trains it, on every value.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufill.campaign.spec.spec import CampaignSpec
from gpufill.forecasting.data.future import with_future
from gpufill.forecasting.data.split import Split
from gpufill.forecasting.trial import Trial


@dataclass(frozen=True, slots=True)
class Trained:
    """A chosen trial's forecast past the end of each project it forecasts: project -> (horizon,), original scale."""

    forecasts: dict[str, np.ndarray]
    epochs: int | None
    """A network's epochs on all the data (None: a classical or statistical family)."""
    seconds: float
    quantiles: dict[str, np.ndarray] = field(default_factory=dict)
    """A quantile network's quantiles past the end: project -> (horizon, Q), original scale."""


def epochs_on_all_data(details: Mapping[str, Any]) -> int | None:
    """The refit's rule: the epochs the campaign's early stopping chose, else every epoch it trained (None: no epochs)."""
    metrics, history = details.get("metrics") or {}, details.get("history") or []
    chosen = metrics.get("fit_refit_epochs") or metrics.get("fit_best_epoch")
    return int(chosen) if chosen else (len(history) or None)


def campaign_threads(details: Mapping[str, Any]) -> int | None:
    """The threads the campaign trained the trial with (its plan's): the same threads make the same numbers (a
    reduction's order, and the tune cache's measured choices, are per thread count)."""
    value = ((details.get("plan") or {}).get("threads") or {}).get("value")
    return int(value) if isinstance(value, int) and value >= 1 else None


def train_on_all_data(spec: CampaignSpec, trial: Trial, details: Mapping[str, Any], projects: Mapping[str, Any], *, threads: int,
                      device: str, tune_cache: str | None) -> Trained:
    """`trial` trained on every value of `projects` (its own project's; a global trial's: all of them) and its forecast
    of the task's horizon after each project's end."""
    from gpufill.forecasting.data.window_scaling import scale_windows
    from gpufill.forecasting.data.windows import make_windows
    from gpufill.forecasting.run import run_alone, run_global, threads_given_back, trial_setup, use_threads

    horizon, started = spec.task.horizon, time.perf_counter()
    split = Split(val=0, test=horizon)
    scaling = spec.recipe(trial.family, trial.train).scaling
    names = list(projects) if trial.is_global else [trial.project]
    windows = [scale_windows(make_windows(with_future(projects[name], horizon), trial.lookback, horizon, split, spec.task.stride,
                                          pad=trial.is_global), scaling) for name in names]
    base = spec.base_config(trial.train, trial.seed)
    if device == "cpu":
        base = dataclasses.replace(base, timed_precision=False)  # as a campaign's worker trains it (worker.py: TrialRunner.setup)
    setup = trial_setup(trial, spec.recipe(trial.family, trial.train), base, threads=threads, device=device, tune_cache=tune_cache,
                        memory_margin=spec.resources.memory_margin)
    epochs = epochs_on_all_data(details) if trial.kind == "neural" else None
    if epochs is not None:
        setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config, epochs=epochs, patience=None))
    # At the threads a campaign's worker runs its trials at: the process's count is part of the tune cache's key, so the
    # campaign's measured choices (an optimizer kernel: a trial's last bits) are the ones found, not measured anew.
    with threads_given_back():
        use_threads(setup.threads)
        result = run_global(trial, windows, setup) if trial.is_global else run_alone(trial, windows[0], setup)
    if result.diverged:
        raise RuntimeError(f"trial {trial.trial_id} ({trial.family}) diverged on all the data")
    forecasts = {name: np.asarray(result.forecasts[name]["forecast"], dtype=np.float64)[-1] for name in names}
    quantiles = {name: np.asarray(result.forecasts[name]["quantiles"], dtype=np.float64)[-1] for name in names
                 if result.forecasts[name].get("quantiles") is not None}
    return Trained(forecasts, epochs, time.perf_counter() - started, quantiles)
