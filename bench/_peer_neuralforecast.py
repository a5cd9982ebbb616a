"""The forecasting peer a user compares gpufill with first: neuralforecast's NBEATS and NHITS at their documented
defaults (`input_size = 2 * h`, `max_steps` 1000, MAE, no scaler, one model, `random_seed` 1), trained on every
series' history and forecasting its held-out horizon, timed as a whole fit + predict (bench/forecast_quality.py:
`--peers`), or as users' whole scripts, one process each (`peer_processes`: bench/peer_speed.py). Lightning's progress bar, logger and checkpoints are off (they change no number, only what is printed
and written). A series shorter than `input_size + h` needs `start_padding_enabled` (M1's short ones): turned on only
where some series is.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class PeerRun:
    """Users' scripts of the peer run at once (`peer_processes`), one process each."""

    forecasts: list[dict[str, np.ndarray]]
    """Each script's forecasts (seeds 1, 2, ...)."""
    whole_s: float
    """Wall seconds from the first script's start to the last one's exit: imports, reading the data, fit and predict."""
    fit_s: float
    """Wall seconds of the fits alone: one script's fit + predict, or from the first fit's start to the last one's end
    (several scripts meet before their fits: the stagger of their imports is not the fits')."""
    changed: dict[str, object]
    """The settings that differ from the defaults (the first script's)."""


SCRIPT = Path(__file__).with_name("_peer_script.py")


def peer_processes(histories: dict[str, np.ndarray], horizon: int, name: str, models: int, *, threads: int | None,
                   max_steps: int | None = None) -> PeerRun:
    """`models` users' scripts at once (bench/_peer_script.py, seeds 1..models), each a process of its own at `threads`
    torch threads (None: torch's default, every core), each importing neuralforecast, reading the histories from a
    CSV and fitting and predicting as `peer_forecasts` does: how a user runs the peer, one script per model (several
    at one thread each where that is faster on their cores)."""
    with tempfile.TemporaryDirectory(prefix="gpufill-peer-") as folder:
        data = Path(folder) / "histories.csv"
        pd.concat([pd.DataFrame({"unique_id": key, "y": history}) for key, history in histories.items()]).to_csv(data, index=False)
        outs = [Path(folder) / f"seed-{DEFAULT_SEED + i}.json" for i in range(models)]
        logs = [Path(folder) / f"seed-{DEFAULT_SEED + i}.log" for i in range(models)]
        started = time.perf_counter()
        running = []
        for i, (out, log) in enumerate(zip(outs, logs, strict=True)):
            command = [sys.executable, str(SCRIPT), "--data", str(data), "--horizon", str(horizon), "--out", str(out), "--peer", name,
                       "--seed", str(DEFAULT_SEED + i), "--threads", str(threads or 0), *(["--max-steps", str(max_steps)] if max_steps else []),
                       *(["--together", folder, "--of", str(models)] if models > 1 else [])]
            with open(log, "wb") as sink:
                running.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT))
        for process, log in zip(running, logs, strict=True):
            if process.wait() != 0:
                raise SystemExit(f"the peer's script failed (exit {process.returncode}): {log.read_text()[-2000:]}")
        whole = time.perf_counter() - started
        results = [json.loads(out.read_text()) for out in outs]
    fit = results[0]["seconds"] if models == 1 else max(r["ended"] for r in results) - min(r["started"] for r in results)
    forecasts = [{key: np.asarray(values, dtype=np.float64) for key, values in r["forecasts"].items()} for r in results]
    return PeerRun(forecasts, whole, fit, results[0]["changed"])
