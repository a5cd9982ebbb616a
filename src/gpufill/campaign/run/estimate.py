"""`gpufill estimate`: time a sample of each trial shape, predict the campaign's time per lane.

Neural shapes: one sample project's training runs for two epochs on `SAMPLE_WINDOWS` windows (at least 8 of the
batches the whole data trains at, at that batch) under the lane's thread count; the second (steady) epoch's time per
step, scaled to the whole data's steps, times the epochs a trial trains, with its validation pass (timed on as many
validation windows) and its refit's epochs over training + validation windows counted. With early stopping those lie
between the fewest it allows and all of them (`epochs_trained`); the estimate takes their geometric middle, the one point off by at most
the square root of their ratio wherever early stopping ends (on M1 with the forecasting recipe the upper bound was
3.9x the run), and keeps both ends as the range. Classical shapes:
real fits (validation's and test's) after an untimed first one, on a sample of the projects (`_timed_fits`); tree
ensembles are timed at `SAMPLE_TREES` and twice that, and extrapolated along that line. A lane's wall time is its
trials' summed time divided by its slots; the campaign's is its slowest lane's, plus the start-up (a worker's
imports and the data's loading, timed).
"""

from __future__ import annotations


import bisect
import dataclasses
import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.trials.trials import GLOBAL_PROJECT, Trial
from gpufill.campaign.executors.forked import worker_startup_seconds
from gpufill.forecasting.run import threads_given_back, use_threads

# Windows a neural sample trains on: enough for steady per-step timings, few enough
# that the largest ablation shapes sample in about a second on a 2-core CPU.
SAMPLE_WINDOWS = 256
SAMPLE_TREES = 20
SAMPLE_PROJECTS = 3
"""Projects a series model over many projects (global mode: one fit each) is timed on, after an untimed first fit."""
SAMPLE_GLOBAL_WINDOWS = 20_000
"""Windows a global window regressor's one fit is timed on (the first projects that hold as many; all of them when
they hold fewer): a fit's cost is not proportional to its windows (a fixed part per tree), so a small sample scaled
up overestimates it (8 of 24 projects made lgbm 2x too high)."""


@dataclass(slots=True)
class ShapeEstimate:
    family: str
    lane: str
    trials: int
    seconds_per_trial: float
    how: str
    range_per_trial: tuple[float, float] | None = None
    """(fewest, most) seconds a trial may take where early stopping decides (None: `seconds_per_trial` both ways)."""

    @property
    def low_s(self) -> float:
        return self.range_per_trial[0] if self.range_per_trial else self.seconds_per_trial

    @property
    def high_s(self) -> float:
        return self.range_per_trial[1] if self.range_per_trial else self.seconds_per_trial

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "lane": self.lane, "trials": self.trials, "seconds_per_trial": round(self.seconds_per_trial, 4), "how": self.how,
                **({"range_per_trial": [round(v, 4) for v in self.range_per_trial]} if self.range_per_trial else {})}


@dataclass(slots=True)
class Estimate:
    lanes: list[Lane]
    shapes: list[ShapeEstimate] = field(default_factory=list)
    sampling_s: float = 0.0
    startup_s: float = 0.0
    """Before the first trial: the workers' start (`worker_startup_seconds`) and loading the data (timed here)."""

    def queues(self) -> dict[str, tuple[Lane, int]]:
        """Queue -> (a lane of it, slots of all its lanes): per-GPU lanes share one queue and add up."""
        out: dict[str, tuple[Lane, int]] = {}
        for lane in self.lanes:
            first, slots = out.get(lane.queue, (lane, 0))
            out[lane.queue] = (first, slots + lane.slots)
        return out

    def lane_seconds(self, per_trial: Callable[[ShapeEstimate], float] = lambda shape: shape.seconds_per_trial) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for shape in self.shapes:
            total[shape.lane] += shape.trials * per_trial(shape)
        return {queue: total[queue] / slots for queue, (_, slots) in self.queues().items()}

    def to_dict(self) -> dict[str, Any]:
        lane_seconds = self.lane_seconds()
        per_family: dict[str, dict[str, float]] = defaultdict(lambda: {"trials": 0, "trial_seconds": 0.0})
        for shape in self.shapes:
            per_family[shape.family]["trials"] += shape.trials
            per_family[shape.family]["trial_seconds"] += shape.trials * shape.seconds_per_trial
        return {
            "lanes": {
                queue: {
                    "trials": sum(s.trials for s in self.shapes if s.lane == queue),
                    "slots": slots,
                    "threads": lane.threads,
                    "device": lane.device,
                    "seconds": round(lane_seconds[queue], 1),
                    "hours": round(lane_seconds[queue] / 3600, 3),
                }
                for queue, (lane, slots) in self.queues().items()
            },
            "total_seconds": round(max(lane_seconds.values(), default=0.0) + self.startup_s, 1),
            "range_seconds": [round(max(self.lane_seconds(per_trial).values(), default=0.0) + self.startup_s, 1)
                              for per_trial in (lambda shape: shape.low_s, lambda shape: shape.high_s)],
            "startup_seconds": round(self.startup_s, 1),
            "families": {name: {"trials": int(v["trials"]), "trial_seconds": round(v["trial_seconds"], 1)} for name, v in per_family.items()},
            "shapes": [shape.to_dict() for shape in self.shapes],
            "sampling_s": round(self.sampling_s, 2),
        }


def estimate(campaign: Campaign, *, progress: Callable[[str], None] | None = None) -> Estimate:

    started = time.perf_counter()
    prepared = campaign.prepare()
    spec = campaign.spec
    tick = time.perf_counter()
    projects = spec.data.load(campaign.base_dir)
    loading_s = time.perf_counter() - tick
    lane_of = {kind: lane for lane in prepared.lanes for kind in lane.kinds}
    trials, scale = prepared.trials, 1.0
    if spec.search is not None:  # its trials are proposed as it runs: the first round is the sample, scaled to the budget
        from gpufill.campaign.trials.search import Search

        search = Search(spec, prepared.fingerprints, max_attempts=1)
        trials = search.first_round()
        scale = spec.search.trials / max(search.proposed, 1)
    groups: dict[str, list[Trial]] = defaultdict(list)
    for trial in trials:
        groups[trial.shape if trial.kind == "neural" else f"{trial.shape}|{sorted(trial.params.items())}"].append(trial)
    result = Estimate(lanes=prepared.lanes)
    with threads_given_back():
        for trials in groups.values():
            sample = trials[0]
            lane = lane_of[sample.kind]
            use_threads(lane.threads)
            names = list(projects) if sample.project == "*" else [sample.project]
            windows = [spec.windows(projects[n], sample.lookback) for n in names]
            if progress is not None:
                progress(f"{sample.family} lookback {sample.lookback} {sample.params}")
            span = None
            if sample.kind == "neural":
                seconds, span, how = _time_neural(sample, windows, spec, lane)
            else:
                seconds, how = _time_classical(sample, windows, spec, lane)
            if scale != 1.0:
                how += f"; a search: its first round's configurations, x{scale:.3g} for its {spec.search.trials} (pruning ends some sooner)"
            result.shapes.append(ShapeEstimate(family=sample.family, lane=lane.queue, trials=round(len(trials) * scale), seconds_per_trial=seconds,
                                               how=how, range_per_trial=span))
    result.startup_s = worker_startup_seconds() + loading_s
    result.sampling_s = time.perf_counter() - started
    return result


def epochs_trained(config: Any, *, refit: bool, validated: bool = True, steps_per_epoch: int | None = None,
                   refit_scale: float = 1.0, validation_scale: float = 1.0) -> tuple[float, float]:
    """(fewest, most) epochs one trial trains, its refit on training + validation included (which trains for the
    epochs early stopping chose), in seconds of one training epoch. Without early stopping both are every epoch; with
    it, the fewest is a best first validation and `patience` validations without improvement after it (then a refit of
    that first validation's epochs), the most is every epoch (and a refit as long). Without validation windows
    (`validated` False) nothing stops early. A step budget (`max_steps`, with the training's `steps_per_epoch`) ends
    each training at that many steps: its epochs' part, the last one's share counted.

    A refit's epoch costs `refit_scale` training epochs (its windows: training's and validation's; two horizons of
    validation on M1 are 1.8x the training's), a first training's epoch `validation_scale` (the validation pass after
    it), so that neither is left out of the estimate (M1's recipe run was 0.60x its estimate with both left out)."""

    def budgeted(epochs: float, scale: float) -> float:
        # `epochs` over `scale` times the training's windows, in training epochs; a step budget ends either training
        cost = epochs * scale
        return min(cost, config.max_steps / steps_per_epoch) if config.max_steps is not None and steps_per_epoch else cost

    first = budgeted(float(config.epochs), 1.0)
    again = budgeted(float(config.epochs), refit_scale) if refit else 0.0
    most = first * validation_scale + again
    if config.patience is None or not validated:
        return most, most
    every = max(1, config.validate_every)
    fewest_first = min(first, every * (config.patience + 1))
    return fewest_first * validation_scale + (budgeted(min(float(config.epochs), every), refit_scale) if refit else 0.0), most


def _time_neural(trial: Trial, windows: list[Any], spec: Any, lane: Lane) -> tuple[float, tuple[float, float] | None, str]:
    """(seconds of one trial, their range where early stopping decides, how they were found)."""
    import math

    from gpufill.forecasting.run import epoch_seconds, trial_setup

    n_full = sum(w.x_train.shape[0] for w in windows)
    n_val = sum(w.x_val.shape[0] for w in windows)
    config = trial_setup(trial, spec.recipe(trial.family, trial.train), spec.base_config(trial.train, trial.seed), threads=lane.threads,
                         device=lane.device, memory_margin=spec.resources.memory_margin).config
    cost = epoch_seconds(trial, windows, config, sample=SAMPLE_WINDOWS)
    refit = bool(spec.train.refit and spec.task.split.val)  # a refit trains again for the epochs early stopping chose (train.refit)
    every = max(1, config.validate_every)
    validation_scale = 1.0 + cost.val_s / every / cost.train_s if n_val and cost.train_s > 0 else 1.0
    counted = {"refit": refit, "validated": bool(spec.task.split.val), "steps_per_epoch": math.ceil(n_full / cost.batch)}
    epochs = epochs_trained(config, **counted)  # what the text says; the seconds count each epoch at its cost
    refit_scale = (n_full + n_val) / max(n_full, 1)  # a refit's windows: training's and validation's
    fewest, most = epochs_trained(config, **counted, refit_scale=refit_scale, validation_scale=validation_scale)
    steady_epoch = cost.train_s
    how = (f"epoch {steady_epoch:.3g} s ({cost.timed} of {n_full} windows timed, batches of {cost.batch})"
           + (f", its validation pass {cost.val_s:.3g} s ({n_val} windows)" if n_val else ""))
    refitted = f" (the refit's over training + validation windows, {refit_scale:.3g}x as many)" if refit else ""
    if fewest == most:
        return steady_epoch * most, None, how + f" x {epochs[1]:.3g} epochs" + refitted
    middle = math.sqrt(fewest * most)
    return (steady_epoch * middle, (steady_epoch * fewest, steady_epoch * most),
            how + f" x {math.sqrt(epochs[0] * epochs[1]):.3g} epochs: the geometric middle of the {epochs[0]:.3g} to {epochs[1]:.3g} that early stopping allows"
            + refitted)


def _time_classical(trial: Trial, windows: list[Any], spec: Any, lane: Lane) -> tuple[float, str]:
    """Seconds of one classical trial over `windows` (validation fit included): timed fits after an untimed first.

    The first fit in a process pays what no later trial of a worker pays again (statsforecast compiles AutoETS and
    Theta with numba: seconds; libraries load); timing it made ets 7x too high (issue 38). A tree ensemble is timed
    at `SAMPLE_TREES` and twice that, and extrapolated along that line (a fit's fixed part, binning the data, is
    paid once, not per tree: scaling one timing by the trees made lgbm 2x too high)."""
    from gpufill.forecasting.models.classical import train_classical

    trees = trial.params.get("n_estimators")
    sampled = isinstance(trees, int) and not isinstance(trees, bool) and trees > 2 * SAMPLE_TREES
    first = dataclasses.replace(trial, params={**trial.params, "n_estimators": SAMPLE_TREES}) if sampled else trial
    train_classical(windows[0], first.family, first.params, threads=lane.threads, seed=trial.seed)
    seconds, how = _timed_fits(first, windows, spec, lane)
    if sampled:
        doubled, _ = _timed_fits(dataclasses.replace(trial, params={**trial.params, "n_estimators": 2 * SAMPLE_TREES}), windows, spec, lane)
        per_tree = max(doubled - seconds, 0.0) / SAMPLE_TREES or seconds / SAMPLE_TREES  # noise: no slope, scale linearly
        seconds += per_tree * (trees - SAMPLE_TREES)
        how += f"; at {SAMPLE_TREES} and {2 * SAMPLE_TREES} of {trees} trees, extrapolated"
    return seconds, how


def _timed_fits(trial: Trial, windows: list[Any], spec: Any, lane: Lane) -> tuple[float, str]:
    """Seconds of `trial` over every project of `windows`, from a sample of them, and how they were timed.

    A series model (one fit per project): `SAMPLE_PROJECTS` fits, times the projects. A global window regressor is
    one fit over every project's windows (timing one project and multiplying by the projects made lgbm 5.6x too
    high): the global fit on `SAMPLE_GLOBAL_WINDOWS` windows' projects, scaled by the windows of all of them."""
    from gpufill.forecasting.models import registry
    from gpufill.forecasting.models.classical import train_classical
    from gpufill.forecasting.run import run_global, trial_setup

    if trial.project == GLOBAL_PROJECT and not registry.resolve(trial.family).fits_series:
        # The first projects that hold SAMPLE_GLOBAL_WINDOWS fitted windows (train + validation), or all of them.
        held = list(itertools.accumulate(w.x_train.shape[0] + w.x_val.shape[0] for w in windows))
        sample = windows[: min(len(held), bisect.bisect_left(held, SAMPLE_GLOBAL_WINDOWS) + 1)]
        setup = trial_setup(trial, spec.recipe(trial.family, trial.train), spec.base_config(trial.train, trial.seed), threads=lane.threads)
        tick = time.perf_counter()
        run_global(trial, sample, setup)
        spent = time.perf_counter() - tick
        rows, timed = held[-1], held[len(sample) - 1]
        return spent * rows / timed, (f"the global fit on {len(sample)} of {len(windows)} projects ({timed} of {rows} windows), scaled by "
                                      f"windows, with {lane.threads} thread(s), validation fit included")
    sample = windows[:SAMPLE_PROJECTS]
    tick = time.perf_counter()
    for one in sample:
        train_classical(one, trial.family, trial.params, threads=lane.threads, seed=trial.seed)
    spent = time.perf_counter() - tick
    return spent / len(sample) * len(windows), (f"{len(sample)} fit(s) timed, x {len(windows)} project(s), with {lane.threads} thread(s), "
                                                "validation fit included")
