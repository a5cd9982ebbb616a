"""How one trial runs: its setup decided in one place, its model seeded and built in one place, and one entry
point per way it trains: `run_alone` (one project; `gpufill train` and a campaign's trial alike) and `run_global`
(one model over every project). A pack of trials: forecasting/packs.py.

Each returns a `TrialResult` (forecasting/trial.py); a diverged training is a result with status "diverged",
which its caller decides about (a campaign records it as failed, `gpufill train` exits 1).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch

from gpufill.engine.backend import mkl_process_threads_settable, set_mkl_process_threads, set_threads
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import cpu_count
from gpufill.engine.losses import outputs_per_target
from gpufill.engine.loop import fit
from gpufill.engine.result import EpochRecord, FitCallback, FitResult
from gpufill.errors import InputError
from gpufill.forecasting.data import WindowedProject
from gpufill.forecasting.data.metrics import mean_over_series
from gpufill.forecasting.data.scoring import ValidationScored, per_origin, score, score_validation
from gpufill.forecasting.models import registry
from gpufill.forecasting.recipes import Recipe
from gpufill.forecasting.task import forecast_of, forecasts_of, point_and_quantiles, predict
from gpufill.forecasting.trial import METRICS, PackEntry, Trial, TrialResult, trial_result

__all__ = ["EpochRecord", "FitCallback", "TrialSetup", "use_threads", "ValidationScorer", "Watch", "build_model", "epoch_seconds", "neural_result", "run_alone", "run_global", "trial_setup"]

@dataclass(frozen=True, slots=True)
class TrialSetup:
    """How a trial trains where it runs, decided: its recipe (scaling, loss, schedule), its FitConfig (a network's)
    and its lane's threads."""

    recipe: Recipe
    config: FitConfig
    threads: int
    fits_series: bool = False
    """A family that fits the series itself (snaive, ets, ...): no scaling, loss or schedule of a recipe is its own to record."""
    refit: bool = False
    """A network trained again on training + validation once early stopping has chosen its length (`refit`)."""

    @property
    def recorded(self) -> Recipe | None:
        """The recipe a result's plan records (None for a family that fits the series)."""
        return None if self.fits_series else self.recipe


def use_threads(threads: int) -> None:
    """A worker's torch threads for the trials it trains: engine/backend.py's `set_threads` (torch's own call would
    leave MKL slower for the rest of the process)."""
    set_threads(threads)


@contextlib.contextmanager
def threads_given_back() -> Iterator[None]:
    """torch's thread count as it was before the block, whatever `use_threads` set inside it (trials trained in a
    process that goes on: an estimate's samples, `gpufill forecast`'s trainings)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        use_threads(before)


def forked_threads_settable() -> bool:
    """Whether a worker forked from a one-thread zygote can take several threads in torch's MKL (engine/backend.py)."""
    return mkl_process_threads_settable()


def use_mkl_threads(threads: int) -> None:
    """torch's MKL count, for a worker forked from a one-thread zygote (engine/backend.py: set_mkl_process_threads)."""
    set_mkl_process_threads(threads)


def trial_setup(trial: Trial, recipe: Recipe, base: FitConfig, *, threads: int | Literal["auto"], device: str | None = None,
                tune_cache: str | None = None, memory_margin: float | None = None, refit: bool = False) -> TrialSetup:
    """The one place a trial's settings become a frozen FitConfig: `base` (the training settings with the trial's
    overrides and seed) with the recipe's loss and schedule and the worker's device, tune cache, memory margin and
    thread count (a lane's slots share the cores: a trial must not measure its way past its share; "auto", as
    `gpufill train` has it: a network measures its threads, a classical model takes every core). `refit`: a network
    trains again on training + validation (a classical model always refits)."""
    fits_series = registry.resolve(trial.family).fits_series
    config = base if fits_series else recipe.fit_config(base, device=device, threads=threads, tune_cache=tune_cache, memory_margin=memory_margin)
    return TrialSetup(recipe=recipe, config=config, threads=cpu_count() if threads == "auto" else threads, fits_series=fits_series,
                      refit=refit and trial.kind == "neural")


def build_model(trial: Trial, windows: WindowedProject, loss: object = None) -> Any:
    """The one place a trial's model is seeded and built: the same seed gives the same initial weights, whether it
    trains alone, in a pack, over every project or once more on all the data (`gpufill forecast`). A network trained
    with a loss of several outputs per step (`quantile`) is its family built for horizon x that many outputs."""
    torch.manual_seed(trial.seed)
    return registry.build(trial.family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=trial.params,
                          outputs_per_step=outputs_per_target(loss))


class Watch(Protocol):
    """What watches a trial's network train (a search's pruner scoring it on validation after each epoch)."""

    def callbacks(self, model: Any) -> Sequence[FitCallback]:
        """The fit callbacks for `model`, about to train."""

    def metrics(self) -> dict[str, Any]:
        """What the trial's result records of it once trained (a pruner: its scores per epoch, where it stopped)."""

    def member(self) -> Callable[[int, Callable[[], torch.Tensor]], str | None]:
        """The same watch for the trial trained as a pack's member (engine/packs/train.py: `PackMember.watch`): asked
        after each epoch with a getter of its validation predictions, in the pack's units."""


def run_alone(trial: Trial, windows: WindowedProject, setup: TrialSetup, *, callbacks: Sequence[FitCallback] = (),
              pack: PackEntry | None = None, watch: Watch | None = None, folded: WindowedProject | None = None) -> TrialResult:
    """Train and score `trial` on its project's windows (already scaled as its recipe says); `folded`: the same
    windows with the validation region folded into training, which a refit (`setup.refit`) trains on."""
    if trial.kind == "classical":
        from gpufill.forecasting.models.classical import classical_plan, train_classical

        run = train_classical(windows, trial.family, trial.params, threads=setup.threads, seed=trial.seed)
        return trial_result(trial, status="completed", plan=classical_plan(run.threads), params=run.params, timings=run.timings,
                            metrics={"test": run.test, "naive": run.naive, **({"val": run.val} if run.val else {}), **per_origin(run.forecast)},
                            forecasts={trial.project: run.forecast} if run.forecast is not None else {},
                            val_forecasts={trial.project: run.val_forecast} if run.val_forecast is not None else {}, recipe=setup.recorded, pack=pack)
    on_cuda = str(setup.config.device).startswith("cuda")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    model = build_model(trial, windows, setup.config.loss)
    callbacks = [*callbacks, *(watch.callbacks(model) if watch is not None else ())]
    fitted = fit(model, (windows.x_train, windows.y_train), (windows.x_val, windows.y_val) if windows.x_val.shape[0] else None,
                 config=setup.config, callbacks=callbacks, data_id=windows.data_id or None)  # a checkpoint resumes on another CPU
    again = refit(trial, fitted, [folded], setup) if folded is not None else None
    peak = int(torch.cuda.max_memory_reserved()) if on_cuda else None
    return neural_result(trial, windows, fitted, setup, pack=pack, peak_memory_bytes=peak, watched=watch.metrics() if watch is not None else None,
                         refitted=(again, folded) if again is not None and folded is not None else None)


def member_result(trial: Trial, fitted: FitResult, windows: Mapping[str, WindowedProject], setups: Mapping[str, TrialSetup],
                   folded: Mapping[str, WindowedProject], pack: PackEntry, peak: int | None, watches: Mapping[str, Watch]) -> TrialResult:
    """A pack member's result (forecasting/packs.py), refit first where it refits, as `run_alone`'s is."""
    setup, more = setups[trial.trial_id], folded.get(trial.trial_id)
    again = refit(trial, fitted, [more], setup) if more is not None else None
    return neural_result(trial, windows[trial.trial_id], fitted, setup, pack=pack, peak_memory_bytes=peak,
                         watched=watches[trial.trial_id].metrics() if trial.trial_id in watches else None,
                         refitted=(again, more) if again is not None and more is not None else None)


def neural_result(trial: Trial, windows: WindowedProject, fitted: FitResult, setup: TrialSetup, *, pack: PackEntry | None = None,
                  peak_memory_bytes: int | None = None, watched: dict[str, Any] | None = None,
                  refitted: tuple[FitResult, WindowedProject] | None = None) -> TrialResult:
    """A trained network scored on its project's test split, next to the naive forecast (alone or a pack's member);
    `watched`: what its Watch recorded, kept with its metrics; `refitted`: its refit and the windows it trained on,
    which then forecasts the test (the validation scores stay `fitted`'s: it never trained on validation)."""
    forecaster, source = (refitted[0], refitted[1]) if refitted is not None else (fitted, windows)
    test, naive, kept = score(windows, *forecast_of(forecaster.model, source, source.x_test, "test", forecaster.plan.autocast_dtype))
    validated = validation(fitted.model, windows, fitted.plan.autocast_dtype)
    done = fitted.to_dict()
    plan, timings, metrics, events = refit_record(done["plan"], fitted, refitted[0] if refitted is not None else None)
    return trial_result(trial, status=refit_status(fitted, refitted[0] if refitted is not None else None), plan=plan, timings=timings, history=done["history"], events=events,
                        metrics={"test": test, "naive": naive, **({"val": validated[0]} if validated else {}),
                                 **{f"fit_{k}": v for k, v in metrics.items()}, **per_origin(kept), **(watched or {})},
                        forecasts={trial.project: kept} if kept is not None else {},
                        val_forecasts={trial.project: validated[1]} if validated else {}, recipe=setup.recorded, pack=pack,
                        peak_memory_bytes=peak_memory_bytes, params=registry.check_params(trial.family, trial.params))


REFIT_REASON = ("train.refit: trained again from its initial weights on training + validation for its best epoch on validation "
                "(where early stopping stopped it, or, without early stopping, the best of its epochs), so "
                "the test forecast has learned the most recent history (as a classical family's refit has); its validation scores "
                "are the first training's, which never saw the validation targets")


def refit(trial: Trial, fitted: FitResult, folded: Sequence[WindowedProject], setup: TrialSetup) -> FitResult | None:
    """`trial`'s network trained again, from the same initial weights and with the same seed, on `folded` (its windows
    with the validation region folded into training) for `fitted`'s best epoch; None where there is nothing to refit:
    `setup.refit` is off, no validation chose a length, or the training diverged or was pruned."""
    best = fitted.metrics.get("best_epoch")
    if not setup.refit or not best or fitted.status in ("diverged", "pruned"):
        return None
    x, y = torch.cat([w.x_train for w in folded]), torch.cat([w.y_train for w in folded])
    alone = folded[0].data_id if len(folded) == 1 else None  # as the first training named its data (run_alone)
    return fit(build_model(trial, folded[0], setup.config.loss), (x, y), None, config=replace(setup.config, epochs=int(best), patience=None), data_id=alone or None)


def refit_status(fitted: FitResult, again: FitResult | None) -> str:
    """The trial's status: its training's, or "diverged" where its refit diverged (the test forecast is the refit's,
    so the trial fails rather than report a forecast its settings did not make)."""
    return "diverged" if again is not None and again.status == "diverged" else fitted.status


def refit_record(plan: dict[str, Any], fitted: FitResult, again: FitResult | None
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    """(plan, timings, fit metrics, events) of a training and its refit (None: the training's own): the refit's
    epochs in the plan with the reason, its seconds in the timings (train_s counts both)."""
    if again is None:
        return plan, dict(fitted.timings), dict(fitted.metrics), list(fitted.events)
    epochs = len(again.history)
    timings = {**fitted.timings, "refit_s": again.timings["train_s"], "train_s": fitted.timings["train_s"] + again.timings["train_s"]}
    events = [*fitted.events, f"refit on training + validation for {epochs} epochs (its best on validation): the test forecast is the refit's",
              *(f"refit: {event}" for event in again.events)]
    return ({**plan, "refit": {"value": epochs, "reason": REFIT_REASON}}, timings,
            {**fitted.metrics, "refit_epochs": epochs, "refit_train_loss": again.metrics.get("train_loss")}, events)


def validation(model: Any, windows: WindowedProject, dtype: torch.dtype | None) -> ValidationScored | None:
    """The metrics of the trained model's forecasts of the validation windows (original scale) and those forecasts,
    or None without a validation split: what choosing between configurations reads, never the test split."""
    if not windows.x_val.shape[0]:
        return None
    return score_validation(windows, *forecast_of(model, windows, windows.x_val, "val", dtype))


def validation_of_each(model: Any, windows: Sequence[WindowedProject], dtype: torch.dtype | None) -> list[ValidationScored | None]:
    """`validation` of each project's windows by one model, their forecasts made in one pass (task.forecasts_of)."""
    scored = [w for w in windows if w.x_val.shape[0]]
    forecasts = iter(forecasts_of(model, scored, "val", dtype) if scored else ())
    return [score_validation(w, *next(forecasts)) if w.x_val.shape[0] else None for w in windows]


class ValidationScorer:
    """A model's validation `metric` over `windows` in the data's units: the mean over the projects with a validation
    window (NaN where none has one), as a global trial's stored score is. Asked many times (a search's pruner, after
    epochs): the windows' inputs joined, their targets and their affine way back to the data's units worked out once,
    so a call is one forward and a few array operations (617 series: 1.4 ms, where scoring each project alone took
    230 ms, more than the epoch it scored)."""

    def __init__(self, windows: Sequence[WindowedProject], metric: str):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}")
        scored = [w for w in windows if w.x_val.shape[0]]
        self.metric = metric
        self.inputs = torch.cat([w.x_val for w in scored]) if scored else None
        self.series = np.repeat(np.arange(len(scored)), [w.x_val.shape[0] for w in scored])  # each joined window's project
        # inverse_target is affine per window: original = scaled * slope + offset.
        offsets = [w.inverse_target(np.zeros(tuple(w.y_val.shape)), "val") for w in scored]
        self.offset = np.concatenate(offsets) if scored else None
        self.slope = np.concatenate([w.inverse_target(np.ones(tuple(w.y_val.shape)), "val") - o for w, o in zip(scored, offsets, strict=True)]) if scored else None
        self.truth = np.concatenate([w.val_truth() for w in scored]) if scored else None
        self.mase_scale = np.array([w.mase_scale for w in scored], dtype=np.float64)

    def __call__(self, model: Any) -> float:
        return self.score(predict(model, self.inputs)) if self.inputs is not None else float("nan")

    def score(self, scaled: np.ndarray | torch.Tensor) -> float:
        """The metric of predictions of the joined validation windows, in the windows' scaled units (a pack's)."""
        if self.inputs is None:
            return float("nan")
        if isinstance(scaled, torch.Tensor):
            scaled = scaled.detach().to("cpu", torch.float64).numpy()
        scaled, _ = point_and_quantiles(np.asarray(scaled, dtype=np.float64).reshape(self.slope.shape[0], -1), self.slope.shape[1])
        prediction = scaled * self.slope + self.offset  # a quantile network's median
        return float(mean_over_series(prediction, self.truth, self.series, self.metric, self.mase_scale))


def run_global(trial: Trial, windows: Sequence[WindowedProject], setup: TrialSetup, *, where: str | None = None,
               watch: Watch | None = None, folded: Sequence[WindowedProject] | None = None) -> TrialResult:
    """`mode: global`: one model trained on every project's windows, scored on each project's test split.

    Each project keeps its own scaling (fitted on its own training part), so windows from projects of different
    levels share one model; metrics are computed per project in its original scale and averaged (the per-project
    values are kept in the result). `folded`: every project's windows with the validation region folded into
    training, which a network's refit (`setup.refit`) trains on and forecasts the test from."""
    widths = {w.n_features for w in windows}
    if len(widths) != 1:
        raise InputError(f"projects have different feature counts {sorted(widths)}", where=where, field="task.mode",
                         fix="use mode: local, or give every project the same covariate columns")
    train_x, train_y = torch.cat([w.x_train for w in windows]), torch.cat([w.y_train for w in windows])
    val_x, val_y = torch.cat([w.x_val for w in windows]), torch.cat([w.y_val for w in windows])
    if trial.kind == "classical":
        points, validations, plan, timings = _global_classical(trial, windows, setup.threads, train_x, train_y, val_x, val_y)
        predictions = [(point, None) for point in points]
        history, events, status = [], [], "completed"
    else:
        model = build_model(trial, windows[0], setup.config.loss)
        fitted = fit(model, (train_x, train_y), (val_x, val_y) if val_x.shape[0] else None, config=setup.config,
                     callbacks=watch.callbacks(model) if watch is not None else ())
        again = refit(trial, fitted, folded, setup) if folded is not None else None
        forecaster, sources = (again, folded) if again is not None and folded is not None else (fitted, windows)
        predictions = forecasts_of(forecaster.model, sources, "test", forecaster.plan.autocast_dtype)
        validations = validation_of_each(fitted.model, windows, fitted.plan.autocast_dtype)
        done = fitted.to_dict()
        plan, timings, _, events = refit_record(done["plan"], fitted, again)
        history, status = done["history"], refit_status(fitted, again)
    per_project, forecasts = {}, {}
    for w, (prediction, quantiles) in zip(windows, predictions, strict=True):
        test, naive, forecasts[w.name] = score(w, prediction, quantiles)
        per_project[w.name] = {"test": test, "naive": naive, **per_origin(forecasts[w.name])}
    average = {part: {key: statistics.fmean(scores[part][key] for scores in per_project.values()) for key in METRICS} for part in ("test", "naive")}
    scored = [v[0] for v in validations if v is not None]
    if scored:  # the projects with validation windows (a short series may have none)
        average["val"] = {key: statistics.fmean(v[key] for v in scored) for key in METRICS}
    val_forecasts = {w.name: v[1] for w, v in zip(windows, validations, strict=True) if v is not None}
    watched = watch.metrics() if watch is not None and trial.kind != "classical" else {}
    return trial_result(trial, status=status, plan=plan, metrics={**average, "per_project": per_project, **watched}, timings=timings, history=history,
                        events=events, forecasts=forecasts, val_forecasts=val_forecasts, recipe=setup.recorded)


def _global_classical(trial: Trial, windows: Sequence[WindowedProject], threads: int, train_x: torch.Tensor, train_y: torch.Tensor,
                      val_x: torch.Tensor, val_y: torch.Tensor
                      ) -> tuple[list[np.ndarray], list[ValidationScored | None], dict[str, Any], dict[str, float]]:
    """Each project's test forecasts and validation metrics and forecasts (None where it has none), the plan and the timings.
    Validated as `train_classical` does: fitted on the train part alone, then again on train + validation for the test."""
    from gpufill.forecasting.models.classical import SeriesForecaster, classical_plan, fit_and_forecast, fit_and_validate, validate_regressor

    def built(w: WindowedProject) -> Any:
        return registry.build(trial.family, n_features=w.n_features, lookback=w.lookback, horizon=w.horizon, params=trial.params)

    model = built(windows[0])
    if isinstance(model, SeriesForecaster):  # a statistical reference is a model of one series: fitted per project in either mode
        predictions, validations, fit_s, predict_s, validate_s = [], [], 0.0, 0.0, 0.0
        for w in windows:
            tick = time.perf_counter()
            validations.append(fit_and_validate(built(w), w, threads=threads, seed=trial.seed))
            validate_s += time.perf_counter() - tick
            prediction, spent = fit_and_forecast(built(w), w, threads=threads, seed=trial.seed)
            predictions.append(prediction)
            fit_s, predict_s = fit_s + spent["fit_s"], predict_s + spent["predict_s"]
        points = sum(w.fit_end for w in windows)
        return predictions, validations, classical_plan(threads), {"fit_s": fit_s, "predict_s": predict_s, "validate_s": validate_s,
                                                                   "samples_per_s": points / fit_s if fit_s > 0 else 0.0}
    tick = time.perf_counter()
    validations = validate_regressor(built(windows[0]), train_x.numpy(), train_y.numpy(), windows, threads=threads, seed=trial.seed)
    validate_s = time.perf_counter() - tick
    x, y = torch.cat([train_x, val_x]).numpy(), torch.cat([train_y, val_y]).numpy()
    tick = time.perf_counter()
    model.fit(x, y, threads=threads, seed=trial.seed)
    fit_s = time.perf_counter() - tick
    tick = time.perf_counter()
    predictions = [w.inverse_target(np.asarray(model.predict(w.x_test.numpy()))) for w in windows]
    return predictions, validations, classical_plan(threads), {"fit_s": fit_s, "predict_s": time.perf_counter() - tick, "validate_s": validate_s,
                                                               "samples_per_s": x.shape[0] / fit_s if fit_s > 0 else 0.0}


class EpochCost(NamedTuple):
    """What an estimate times of one trial: its steady epoch over every training window, the validation pass after it
    over every validation window (0.0 without them), the training windows timed and the batch they trained at."""

    train_s: float
    val_s: float
    timed: int
    batch: int


def epoch_seconds(trial: Trial, windows: Sequence[WindowedProject], config: FitConfig, *, sample: int, min_steps: int = 8) -> EpochCost:
    """One steady epoch of `trial` over all `windows` and its validation pass, from two epochs timed on `sample` of the
    windows (an estimate's), or on `min_steps` batches where that is more, validated on as many validation windows.

    The sample trains at the batch the whole data trains at: left to choose, 256 windows take a batch of 64 (four
    steps an epoch), whose steps cost twice as much per window as the campaign's 128 (Tourism: the estimate's epoch
    1.4x the run's). The second epoch's seconds per step scale to the whole data's steps; the two validations' mean
    seconds per window to the whole validation region's (two horizons of it on M1: 0.8x the training's windows)."""
    from gpufill.engine.batching import DataFacts, effective_batch

    x, y = torch.cat([w.x_train for w in windows]), torch.cat([w.y_train for w in windows])
    x_val, y_val = torch.cat([w.x_val for w in windows]), torch.cat([w.y_val for w in windows])
    batch = effective_batch(DataFacts(n_train=x.shape[0], bytes_total=0), config).value
    taken = min(x.shape[0], max(sample, min_steps * batch))
    checked = min(x_val.shape[0], taken)
    fitted = fit(build_model(trial, windows[0], config.loss), (x[:taken], y[:taken]), (x_val[:checked], y_val[:checked]) if checked else None,
                 config=replace(config, epochs=2, patience=None, batch_size=batch, max_steps=None))
    last = fitted.history[-1]
    validations = sum(1 for record in fitted.history if record.val_loss is not None) or 1  # validate_every may skip one
    val_s = fitted.timings["val_s"] / validations * x_val.shape[0] / checked if checked else 0.0
    return EpochCost(last.seconds / max(last.steps, 1) * math.ceil(x.shape[0] / batch), val_s, taken, batch)
