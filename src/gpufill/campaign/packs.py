"""A worker's side of fused packs: same-shape neural trials trained as one pack, each scored alone.

For a shape the scheduler has not sized yet, the worker first measures one model at a
time against fused packs of 2, 4, ... 64 on its device (`engine.packs.size.measure_pack_size`),
tells the scheduler at once (the size, and each size's peak memory with the trials' data,
which GPU admission adds up), trains one pack of the measured size, and hands the other
trials back (not attempted); later packs of that shape arrive at the measured size. Each
trial's result has the same shape as an unfused trial's, with the pack's time shared among
its models and the pack's peak memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Protocol

import torch

from gpufill.campaign.attempt import attempt, unfused_because
from gpufill.forecasting.data.scoring import score as score_test
from gpufill.forecasting.task import ForecastRun, predict
from gpufill.engine.hardware import context_bytes, detect
from gpufill.forecasting.models import registry
from gpufill.engine.losses import NAMED
from gpufill.engine.packs.stacked import pack_kind, why_not_packed
from gpufill.engine.packs.train import PackMember, fit_pack
from gpufill.engine.packs.size import CANDIDATE_SIZES, PackSizeChoice, measure_pack_size
from gpufill.engine.plan import DataFacts, make_plan



class TrialRunner(Protocol):
    """What packs need of the worker's runner (campaign/worker.py)."""

    device: str

    def trial_windows(self, trial: dict[str, Any]) -> Any: ...
    def recipe(self, trial: dict[str, Any]) -> Any: ...
    def fit_config(self, trial: dict[str, Any]) -> Any: ...
    def run(self, trial: dict[str, Any]) -> dict[str, Any]: ...
    def note(self, message: dict[str, Any]) -> None: ...
    def attempt(self, trial: dict[str, Any], run: Any) -> dict[str, Any]: ...


def run_pack(runner: TrialRunner, trials: list[dict[str, Any]], pack_size: int | None, kind: str | None = None) -> dict[str, Any]:
    """Train `trials` (one shape) as packs of `pack_size` of `kind` (None: measure both here first)."""
    windows = {t["trial_id"]: runner.trial_windows(t) for t in trials}
    choice = None
    if pack_size is None:  # a new shape: measure on this device
        first = trials[0]
        sample = windows[first["trial_id"]]
        config = runner.fit_config(first)
        batch = make_plan(detect(runner.device), DataFacts(n_train=sample.x_train.shape[0], bytes_total=0), config).effective_batch.value

        def build() -> torch.nn.Module:
            return registry.build(first["family"], n_features=sample.n_features, lookback=sample.lookback, horizon=sample.horizon, params=first["params"])

        candidates = [k for k in CANDIDATE_SIZES if k <= len(trials)]
        try:
            if config.schedule != "constant":
                choice = PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: schedule {config.schedule} (a pack runs a constant lr)")
            elif (why_not := why_not_packed(build, NAMED["mse"], (sample.x_train[:8], sample.y_train[:8]))) is not None:
                choice = PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: {first['family']}: {why_not}")
            else:
                choice = measure_pack_size(build, (sample.x_train, sample.y_train), batch=batch, device=runner.device, candidates=candidates,
                                           data_bytes=_data_bytes(sample), memory_budget=_memory_budget(runner.device, config.memory_margin))
        except Exception as error:  # the trials themselves will report it, one by one
            choice = PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: measuring packs failed ({type(error).__name__})")
        pack_size, kind = choice.size, choice.kind
        runner.note({"pack": _pack_message(choice)})  # the scheduler sizes and admits this shape from now on
    # Run one pack of the measured size; hand the rest back, so other workers share them.
    trials, returned = trials[:pack_size], [t["trial_id"] for t in trials[pack_size:]]
    results: list[dict[str, Any]] = []
    if pack_size == 1:
        results = [runner.attempt(t, lambda t=t: runner.run(t)) for t in trials]
        if choice is not None:
            unfused_because(results, choice.reason)
    else:
        # Same shape string, but projects may differ in covariates: fuse only equal widths.
        by_width: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for trial in trials:
            by_width[windows[trial["trial_id"]].n_features].append(trial)
        for group in by_width.values():
            for start in range(0, len(group), pack_size):
                results += _train_chunk(runner, group[start : start + pack_size], windows, choice.reason if choice else None, kind)
    pack = None if choice is None else _pack_message(choice)
    return {"results": results, "pack": pack, "returned": returned}


def _pack_message(choice: PackSizeChoice) -> dict[str, Any]:
    """What the scheduler learns of a shape: the size, why, and a pack's peak device memory per K
    (the measured step's peak plus K trials' data, which a pack keeps on the device)."""
    return {"size": choice.size, "reason": choice.reason, "kind": choice.kind, "samples_per_s": {str(k): v for k, v in choice.samples_per_s.items()},
            "peak_bytes": {str(k): peak for k, peak in choice.peak_bytes.items()}}


def _memory_budget(device: str, margin: float) -> int | None:
    """memory_margin of the device, less what this process holds outside the allocator (CUDA only)."""
    if not device.startswith("cuda"):
        return None
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return int(margin * total) - (context_bytes(device) or 0)


def _data_bytes(windows: Any) -> int:
    """One trial's windows as a pack holds them on the device (train and validation)."""
    return sum(int(t.numel()) * t.element_size() for t in (windows.x_train, windows.y_train, windows.x_val, windows.y_val))


def _train_chunk(runner: TrialRunner, chunk: list[dict[str, Any]], windows: dict[str, Any], reason: str | None,
                 kind: str | None) -> list[dict[str, Any]]:
    if len(chunk) == 1:
        return [runner.attempt(chunk[0], lambda: runner.run(chunk[0]))]
    runner.note({"started": [t["trial_id"] for t in chunk]})
    on_cuda = runner.device.startswith("cuda")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        models, members = [], []
        for trial in chunk:
            w = windows[trial["trial_id"]]
            config = runner.fit_config(trial)
            torch.manual_seed(trial["seed"])  # the same initial weights as the unfused trial
            models.append(registry.build(trial["family"], n_features=w.n_features, lookback=w.lookback, horizon=w.horizon, params=trial["params"]))
            members.append(PackMember(train=(w.x_train, w.y_train), val=(w.x_val, w.y_val) if w.x_val.shape[0] else None,
                                      lr=config.lr, weight_decay=config.weight_decay, seed=trial["seed"]))
        config = runner.fit_config(chunk[0])  # tune cache: the pack's compile measurement, once per shape
        fits = fit_pack(models, members, config=config, kind=kind)
        peak = int(torch.cuda.max_memory_reserved()) if on_cuda else None  # the pack's, for GPU admission
    except Exception as error:  # a fused kernel failed: these trials still run, one at a time, saying why
        results = [runner.attempt(t, lambda t=t: runner.run(t)) for t in chunk]
        unfused_because(results, f"the pack of {len(chunk)} failed ({type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}); "
                                 "trained one at a time")
        return results
    out = []
    for trial, fitted in zip(chunk, fits, strict=True):
        w = windows[trial["trial_id"]]

        def score(trial: dict[str, Any] = trial, fitted: Any = fitted, w: Any = w) -> dict[str, Any]:
            test, naive, kept = score_test(w, w.inverse_target(predict(fitted.model, w.x_test, dtype=fitted.plan.autocast_dtype)))
            run = ForecastRun(project=trial["project"], family=trial["family"], params=trial["params"], fit=fitted, test=test, naive=naive, forecast=kept)
            result = run.to_dict()
            runner.recipe(trial).record(result["plan"], neural=True)
            result["timings"]["peak_memory_bytes"] = peak
            result["plan"]["pack_size"] = {"value": len(chunk), "reason": reason or f"a pack of {len(chunk)} ({kind or pack_kind(fitted.model)}): "
                                           "the size the scheduler sent (measured for this shape, or resources.pack_size)"}
            if fitted.status == "diverged":
                raise FloatingPointError(f"training diverged: {fitted.events[0] if fitted.events else 'non-finite loss'}")
            return result

        message = attempt(trial, score)
        message["seconds"] = fitted.timings["train_s"]  # this trial's share of the pack's time
        runner.note({"result": message})
        out.append(message)
    return out
