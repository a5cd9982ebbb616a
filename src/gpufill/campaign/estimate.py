"""`gpufill estimate`: time a sample of each trial shape, predict the campaign's time per lane.

Neural shapes: one sample project's training runs for two epochs on at most
`SAMPLE_WINDOWS` windows under the lane's thread count; the second (steady) epoch,
scaled to the full window count, times the configured epochs. Early stopping can only
make the real campaign shorter, so neural figures are upper bounds. Classical shapes:
real fits (validation's and test's) after an untimed first one; tree ensembles are fitted with at most `SAMPLE_TREES` trees and scaled
linearly (their fit time is linear in the number of trees). A lane's wall time is its
trials' summed time divided by its slots.
"""

from __future__ import annotations


import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpufill.campaign.lanes import Lane
from gpufill.campaign.runner import Campaign
from gpufill.campaign.trials import Trial

# Windows a neural sample trains on: enough for steady per-step timings, few enough
# that the largest ablation shapes sample in about a second on a 2-core CPU.
SAMPLE_WINDOWS = 256
SAMPLE_TREES = 20
SAMPLE_PROJECTS = 3
"""Projects a classical shape over many projects (global mode) is timed on, after an untimed first fit."""


@dataclass(slots=True)
class ShapeEstimate:
    family: str
    lane: str
    trials: int
    seconds_per_trial: float
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "lane": self.lane, "trials": self.trials, "seconds_per_trial": round(self.seconds_per_trial, 4), "how": self.how}


@dataclass(slots=True)
class Estimate:
    lanes: list[Lane]
    shapes: list[ShapeEstimate] = field(default_factory=list)
    sampling_s: float = 0.0

    def queues(self) -> dict[str, tuple[Lane, int]]:
        """Queue -> (a lane of it, slots of all its lanes): per-GPU lanes share one queue and add up."""
        out: dict[str, tuple[Lane, int]] = {}
        for lane in self.lanes:
            first, slots = out.get(lane.queue, (lane, 0))
            out[lane.queue] = (first, slots + lane.slots)
        return out

    def lane_seconds(self) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for shape in self.shapes:
            total[shape.lane] += shape.trials * shape.seconds_per_trial
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
            "total_seconds": round(max(lane_seconds.values(), default=0.0), 1),
            "families": {name: {"trials": int(v["trials"]), "trial_seconds": round(v["trial_seconds"], 1)} for name, v in per_family.items()},
            "shapes": [shape.to_dict() for shape in self.shapes],
            "sampling_s": round(self.sampling_s, 2),
        }


def estimate(campaign: Campaign, *, progress: Callable[[str], None] | None = None) -> Estimate:

    started = time.perf_counter()
    prepared = campaign.prepare()
    spec = campaign.spec
    projects = spec.data.load(campaign.base_dir)
    lane_of = {kind: lane for lane in prepared.lanes for kind in lane.kinds}
    groups: dict[str, list[Trial]] = defaultdict(list)
    for trial in prepared.trials:
        groups[trial.shape if trial.kind == "neural" else f"{trial.shape}|{sorted(trial.params.items())}"].append(trial)
    result = Estimate(lanes=prepared.lanes)
    threads_before = torch.get_num_threads()
    try:
        for trials in groups.values():
            sample = trials[0]
            lane = lane_of[sample.kind]
            torch.set_num_threads(lane.threads)
            names = list(projects) if sample.project == "*" else [sample.project]
            windows = [spec.windows(projects[n], sample.lookback) for n in names]
            if progress is not None:
                progress(f"{sample.family} lookback {sample.lookback} {sample.params}")
            if sample.kind == "neural":
                seconds, how = _time_neural(sample, windows, spec, lane)
            else:
                seconds, how = _time_classical(sample, windows, lane)
            result.shapes.append(ShapeEstimate(family=sample.family, lane=lane.queue, trials=len(trials), seconds_per_trial=seconds, how=how))
    finally:
        torch.set_num_threads(threads_before)
    result.sampling_s = time.perf_counter() - started
    return result


def _time_neural(trial: Trial, windows: list[Any], spec: Any, lane: Lane) -> tuple[float, str]:
    from gpufill.forecasting.run import epoch_seconds, trial_setup

    n_full = sum(w.x_train.shape[0] for w in windows)
    sample = min(n_full, SAMPLE_WINDOWS)
    config = trial_setup(trial, spec.recipe(trial.family, trial.train), spec.base_config(trial.train, trial.seed), threads=lane.threads,
                         device=lane.device, memory_margin=spec.resources.memory_margin).config
    steady_epoch = epoch_seconds(trial, windows, config, sample=SAMPLE_WINDOWS)
    return steady_epoch * config.epochs, (f"epoch {steady_epoch:.3g} s ({sample} of {n_full} windows timed) x {config.epochs} epochs; "
                                          "an upper bound with early stopping")


def _time_classical(trial: Trial, windows: list[Any], lane: Lane) -> tuple[float, str]:
    from gpufill.forecasting.models.classical import train_classical

    params = dict(trial.params)
    trees = params.get("n_estimators")
    scale = 1.0
    if isinstance(trees, int) and trees > SAMPLE_TREES:
        params["n_estimators"], scale = SAMPLE_TREES, trees / SAMPLE_TREES
    # The first fit in a process pays what no later trial of a worker pays again (statsforecast compiles AutoETS and
    # Theta with numba: seconds; libraries load): it is not timed. Timing it made ets 7x too high (issue 38).
    train_classical(windows[0], trial.family, params, threads=lane.threads, seed=trial.seed)
    timed = windows[:SAMPLE_PROJECTS]
    tick = time.perf_counter()
    for one in timed:
        train_classical(one, trial.family, params, threads=lane.threads, seed=trial.seed)
    seconds = (time.perf_counter() - tick) / len(timed) * scale * len(windows)
    scaled = f" with {SAMPLE_TREES} of {trees} trees, scaled linearly" if scale != 1.0 else ""
    return seconds, (f"{len(timed)} fit(s) timed after an untimed first{scaled}, x {len(windows)} project(s), with {lane.threads} thread(s) "
                     "(validation fit included)")
