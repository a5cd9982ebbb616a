"""The forecasting peer a user compares gpufill with first: neuralforecast's NBEATS and NHITS at their documented
defaults (`input_size = 2 * h`, `max_steps` 1000, MAE, no scaler, one model, `random_seed` 1), trained on every
series' history and forecasting its held-out horizon, timed as a whole fit + predict (bench/forecast_quality.py:
`--peers`). Lightning's progress bar, logger and checkpoints are off (they change no number, only what is printed
and written). A series shorter than `input_size + h` needs `start_padding_enabled` (M1's short ones): turned on only
where some series is.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

PEERS = ("nbeats", "nhits")
"""--peers' names: neuralforecast's model class of each."""


DEFAULT_SEED = 1
"""neuralforecast's documented `random_seed`."""


def model_class(name: str) -> type:
    """neuralforecast's model class of a --peers name (imported here: neuralforecast brings Lightning)."""
    from neuralforecast.models import NBEATS, NHITS

    return {"nbeats": NBEATS, "nhits": NHITS}[name]


def unknown_settings(names: list[str], peers: tuple[str, ...]) -> list[str]:
    """The `names` that are not a named argument of every one of the `peers`' model classes (checked before anything
    trains: neuralforecast hands unknown keywords to Lightning's Trainer, which fails only once the peer runs)."""
    import inspect

    return [name for name in names if any(name not in inspect.signature(model_class(peer).__init__).parameters for peer in peers)]


def peer_forecasts(histories: dict[str, np.ndarray], horizon: int, name: str, *, max_steps: int | None = None, seed: int = DEFAULT_SEED,
                   full_windows: bool = False, settings: dict[str, object] | None = None) -> tuple[dict[str, np.ndarray], float, dict[str, object]]:
    """(series -> its forecast of the `horizon` steps after its history, the fit + predict wall seconds, the settings
    that differ from the defaults). `max_steps`: fewer training steps than the default 1000 (the smoke size only);
    `seed`: another `random_seed` than the default's (a peer's spread over seeds); `full_windows`: train on windows
    whose whole horizon is real only (by default neuralforecast pads each series' end by a horizon and keeps every
    window with one real target, the others masked out of the loss: the windows nearest the forecast origin);
    `settings`: the model's other arguments in place of their defaults (an ablation of the peer's regime, e.g.
    `num_lr_decays=0`)."""
    from neuralforecast import NeuralForecast

    for logger in ("lightning", "pytorch_lightning", "lightning.pytorch", "neuralforecast"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    model_type = model_class(name)
    input_size = 2 * horizon
    changed: dict[str, object] = {}
    if min(len(h) for h in histories.values()) < input_size + horizon:
        changed["start_padding_enabled"] = True
    if max_steps is not None:
        changed["max_steps"] = max_steps
    if seed != DEFAULT_SEED:
        changed["random_seed"] = seed
    if full_windows:
        changed["training_data_availability_threshold"] = [0.0, 1.0]  # every target of a window real
    changed.update(settings or {})
    frame = pd.concat([pd.DataFrame({"unique_id": key, "ds": pd.date_range("2000-01-01", periods=len(history), freq="MS"), "y": history})
                       for key, history in histories.items()], ignore_index=True)
    model = model_type(h=horizon, input_size=input_size, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, **changed)
    started = time.perf_counter()
    forecaster = NeuralForecast(models=[model], freq="MS")
    forecaster.fit(df=frame)
    predicted = forecaster.predict()
    seconds = time.perf_counter() - started
    column = model_type.__name__
    predicted = predicted.reset_index() if "unique_id" not in predicted.columns else predicted
    out = {key: part.sort_values("ds")[column].to_numpy(np.float64) for key, part in predicted.groupby("unique_id")}
    return out, seconds, changed


def _fit_at_one_thread(histories: dict[str, np.ndarray], horizon: int, name: str, max_steps: int | None, seed: int,
                       ready) -> tuple[dict[str, np.ndarray], float, float]:
    """One peer fit + predict in a process of its own at one torch thread, started with the others at a barrier (so
    that their imports are not timed): (its forecasts, the wall clock at its start, at its end)."""
    import torch

    torch.set_num_threads(1)
    model_class(name)  # neuralforecast's import before the barrier
    ready.wait()
    started = time.time()
    forecasts, _, _ = peer_forecasts(histories, horizon, name, max_steps=max_steps, seed=seed)
    return forecasts, started, time.time()


def peer_forecasts_one_thread_each(histories: dict[str, np.ndarray], horizon: int, name: str, models: int, *,
                                   max_steps: int | None = None) -> tuple[list[dict[str, np.ndarray]], float]:
    """`models` peer fits at once, one process and one torch thread each (seeds 1, 2, ...): how a user with as many
    cores runs the peer when one thread a model is faster than all of them on one. (Each fit's forecasts, the wall
    seconds from the first fit's start to the last one's end.)"""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh torch in each: its thread pool not yet sized
    with context.Manager() as manager, context.Pool(models) as pool:
        ready = manager.Barrier(models)
        pending = [pool.apply_async(_fit_at_one_thread, (histories, horizon, name, max_steps, DEFAULT_SEED + i, ready)) for i in range(models)]
        done = [job.get() for job in pending]
    return [forecasts for forecasts, _, _ in done], max(end for *_, end in done) - min(start for _, start, _ in done)
