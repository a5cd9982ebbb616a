"""Before/after: the training loop the guides start from, against gpufill.fit on the same model and data.

The baseline is deliberately the common loop, not a straw man: a per-sample
`Dataset.__getitem__` over windows held as a numpy array (each sample converted with
`torch.tensor`, as tutorials write it), `DataLoader(batch_size=128, num_workers=0)`,
fp32, Adam, `loss.item()` every step, validation every epoch with a per-batch `.cpu()`.
Both loops run once untimed first, so neither pays the process's lazy initialisation.

`compare` also runs variants of gpufill (the ablations of `gpufill bench`: one speed-up
switched off each) in the same interleaved rounds, and measures GPU utilisation per run.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils import _pytree as pytree

from gpufill.bench.guides import count_samples, guides_loader, head, validation_loss
from gpufill.bench.minimal import minimal_fit
from gpufill.bench.utilisation import UtilisationMeter
from gpufill.engine import losses
from gpufill.engine.batches import sample_count
from gpufill.engine.config import DEFAULTS, FitConfig
from gpufill.engine.hardware import resolve_device
from gpufill.engine.inputs import Data, as_source
from gpufill.engine.loop import fit
from gpufill.engine.result import FitCallback
from gpufill.errors import InputError


@dataclasses.dataclass(slots=True)
class LoopMeasurement:
    """One training's speed and quality, measured the same way for every loop."""

    name: str
    samples_per_s: float
    """Training samples per second in the median steady epoch (all but the first)."""
    epoch_s: float
    first_epoch_s: float
    val_loss: float
    """The training's loss for the final model on the validation data (fp32; a forecaster's: MSE in scaled space)."""
    peak_memory_mib: float | None
    """Peak device memory on CUDA; peak process RSS on CPU."""
    val_loss_runs: list[float] = dataclasses.field(default_factory=list)
    """Each seed's validation loss when several runs were summarised."""
    gpu_util: float | None = None
    """Mean GPU utilisation (%) during the run, from NVML; None on CPU or without NVML."""
    samples_per_s_runs: list[float] = dataclasses.field(default_factory=list)
    """Each round's samples/s when several runs were summarised (the paired ratios come from these)."""
    total_s: float | None = None
    """The whole training end to end: set-up (gpufill's probe, a compile's first call) and every epoch."""
    probe_s: float | None = None
    """gpufill only: seconds its probe spent measuring before the first epoch."""
    probe_budget_s: float | None = None
    """gpufill only: the budget its probe was given (as its plan states it)."""
    plan: dict[str, Any] | None = None
    """gpufill only: the measured settings it trained with (value per setting)."""

    def row(self) -> dict[str, Any]:
        return {
            "loop": self.name,
            "samples_per_s": round(self.samples_per_s, 1),
            "epoch_s": round(self.epoch_s, 4),
            "first_epoch_s": round(self.first_epoch_s, 4),
            "val_loss": round(self.val_loss, 6),
            "peak_memory_mib": None if self.peak_memory_mib is None else round(self.peak_memory_mib, 1),
            "gpu_util": None if self.gpu_util is None else round(self.gpu_util, 1),
            "val_loss_runs": [round(v, 6) for v in self.val_loss_runs] or None,
            "samples_per_s_runs": [round(v, 1) for v in self.samples_per_s_runs] or None,
            "total_s": None if self.total_s is None else round(self.total_s, 3),
            "probe_s": None if self.probe_s is None else round(self.probe_s, 3),
            "probe_budget_s": None if self.probe_budget_s is None else round(self.probe_budget_s, 3),
            "plan": self.plan,
        }


class _PeakMemory(FitCallback):
    """Peak device memory (CUDA) or process RSS (CPU), sampled at epoch ends on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_rss = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def sample(self) -> None:
        if self.device.type != "cuda":
            self.peak_rss = max(self.peak_rss, psutil.Process().memory_info().rss)

    def on_epoch_end(self, record: Any) -> None:
        self.sample()

    def mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return self.peak_rss / 2**20


def baseline_fit(
    model: nn.Module,
    train: Data,
    val: Data,
    *,
    epochs: int,
    loss: Any = "mse",
    lr: float = DEFAULTS.lr,
    batch_size: int = 128,
    micro_batch: int | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    patience: int | None = None,
) -> LoopMeasurement:
    """The guides' starting loop (see module docstring). Trains `model` in place.

    With `micro_batch`, loader batches of that size are accumulated to `batch_size` (each
    loss scaled by its share), as the guides' accumulation recipe does. With `patience`, it
    stops after that many epochs without a better validation loss and restores the best
    weights, as the guides' early-stopping recipe does.
    """
    started = time.perf_counter()
    device = torch.device(device)
    loss_fn, _ = losses.resolve(loss)
    torch.manual_seed(seed)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    per_step = max(1, batch_size // micro_batch) if micro_batch else 1
    loader = guides_loader(train, micro_batch or batch_size)
    val_loader = guides_loader(val, batch_size)
    memory = _PeakMemory(device)
    seconds = []
    samples = 0
    best, best_state, waited = float("inf"), None, 0
    for _epoch in range(epochs):
        tick = time.perf_counter()
        model.train()
        samples = 0
        for index, batch in enumerate(loader):
            batch = _blocking_copy(batch, device)
            value = loss_fn(model, batch)["loss"]
            (value / per_step).backward()
            if (index + 1) % per_step == 0:
                optimizer.step()
                optimizer.zero_grad()
            _running = value.item()  # the guides log every step: one sync per step
            samples += sample_count(batch)
        if samples and (index + 1) % per_step:  # a last, short group of micro-batches: its step too
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for batch in val_loader:
                total += loss_fn(model, _blocking_copy(batch, device))["loss"].item() * sample_count(batch)  # a sync per batch
        seconds.append(time.perf_counter() - tick)
        memory.sample()
        if patience is not None:
            if total < best:
                best, best_state, waited = total, copy.deepcopy(model.state_dict()), 0
            else:
                waited += 1
                if waited >= patience:
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    total = time.perf_counter() - started
    measured = _measurement("baseline", model, val, loss, seconds, samples, memory)
    measured.total_s = total
    return measured


def _blocking_copy(batch: Any, device: torch.device) -> Any:
    """`.to(device)` leaf by leaf, as the guides write it (no pinned memory, so no overlap)."""
    return pytree.tree_map(lambda leaf: leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf, batch)


def gpufill_fit(
    model: nn.Module,
    train: Data,
    val: Data,
    *,
    epochs: int,
    config: FitConfig | None = None,
    name: str = "gpufill",
) -> LoopMeasurement:
    """gpufill.fit with the automatic plan (or `config`); epoch time includes its validation."""
    config = dataclasses.replace(config or FitConfig(), epochs=epochs)
    device = resolve_device(config.device)
    memory = _PeakMemory(device)
    tick = time.perf_counter()
    result = fit(model, train, val, config=config, callbacks=[memory])
    total = time.perf_counter() - tick
    seconds = [record.seconds for record in result.history]
    # Validation time is inside the baseline's epochs: add gpufill's share for a fair epoch.
    val_share = result.timings["val_s"] / max(len(seconds), 1)
    samples = count_samples(train) or round(result.timings["samples_per_s"] * result.timings["epoch_s"])
    measured = _measurement(name, result.model, val, config.loss, [s + val_share for s in seconds], samples, memory)
    measured.total_s, measured.probe_s = total, result.plan.probe.value
    budget = re.search(r"budget ([\d.]+) s", result.plan.probe.reason)
    measured.probe_budget_s = float(budget.group(1)) if budget else None
    measured.plan = {name: getattr(result.plan, name).value for name in MEASURED_SETTINGS}
    return measured


MEASURED_SETTINGS = ("threads", "precision", "tf32", "cudnn_benchmark", "optimizer_kernel", "step_graph", "compile", "micro_batch")
"""The plan settings a gpufill row records: what its probe decided."""


def minimal_measured(
    model: nn.Module, train: Data, val: Data, *, epochs: int, device: str, seed: int, loss: Any = "mse", lr: float = DEFAULTS.lr,
    batch_size: int = 128, tuned: bool = False, name: str = "minimal",
) -> LoopMeasurement:
    """The careful hand-written loop (see `minimal`; `tuned`: with the guides' settings), measured like the others."""
    memory = _PeakMemory(torch.device(device))
    tick = time.perf_counter()
    seconds = minimal_fit(model, train, val, epochs=epochs, device=device, seed=seed, loss=loss, lr=lr, batch_size=batch_size, tuned=tuned)
    total = time.perf_counter() - tick
    memory.sample()
    measured = _measurement(name, model, val, loss, seconds, sample_count(train), memory)
    measured.total_s = total
    return measured


def lightning_measured(
    model: nn.Module, train: Data, val: Data, *, epochs: int, device: str, seed: int, loss: Any = "mse", lr: float = DEFAULTS.lr,
    batch_size: int = 128,
) -> LoopMeasurement:
    """Lightning's Trainer (see `lightning`), measured like the others."""
    from gpufill.bench.lightning import lightning_fit

    memory = _PeakMemory(torch.device(device))
    tick = time.perf_counter()
    seconds = lightning_fit(model, train, val, epochs=epochs, device=device, seed=seed, loss=loss, lr=lr, batch_size=batch_size)
    total = time.perf_counter() - tick
    memory.sample()
    measured = _measurement("lightning", model, val, loss, seconds, sample_count(train), memory)
    measured.total_s = total
    return measured


def _measurement(name: str, model: nn.Module, val: Data, loss: Any, seconds: list[float], n_train: int, memory: _PeakMemory) -> LoopMeasurement:
    # Median of the steady epochs: one epoch disturbed by another process does not move it.
    epoch_s = statistics.median(seconds[1:] or seconds)
    return LoopMeasurement(
        name=name,
        samples_per_s=n_train / epoch_s,
        epoch_s=epoch_s,
        first_epoch_s=seconds[0],
        val_loss=validation_loss(model, val, loss),
        peak_memory_mib=memory.mib(),
    )


def validation_mse(model: nn.Module, val: tuple[torch.Tensor, torch.Tensor]) -> float:
    """A forecaster's yardstick: fp32 MSE of the final model on the validation windows."""
    return validation_loss(model, val, "mse")


def _metered(meter: UtilisationMeter | None, run: Callable[..., LoopMeasurement], *args: Any, **kwargs: Any) -> LoopMeasurement:
    if meter is None:
        return run(*args, **kwargs)
    with meter.measure() as readings:
        measurement = run(*args, **kwargs)
    measurement.gpu_util = statistics.fmean(readings) if readings else None
    return measurement


@dataclasses.dataclass(slots=True)
class Comparison:
    """Paired runs: run i of every loop used seed i, and the runs of one round ran back to back."""

    baseline: list[LoopMeasurement]
    gpufill: list[LoopMeasurement]
    variants: dict[str, list[LoopMeasurement]] = dataclasses.field(default_factory=dict)
    """gpufill with some settings changed (an ablation each), by name."""
    minimal: list[LoopMeasurement] = dataclasses.field(default_factory=list)
    """The careful hand-written fp32 loop, when asked for (see `gpufill.bench.minimal`)."""
    others: dict[str, list[LoopMeasurement]] = dataclasses.field(default_factory=dict)
    """What else a user would write, when asked for: "hand loop, tuned" (the guides' settings), "lightning"."""

    def speedup(self) -> float:
        """Median over pairs of gpufill / baseline samples/s: adjacent runs share the machine's drift."""
        return _paired_ratio(self.gpufill, self.baseline)

    def worth(self, variant: str) -> float:
        """Median over pairs of gpufill / variant samples/s: what the settings the variant changed are worth."""
        return _paired_ratio(self.gpufill, self.variants[variant])

    def minimal_over_baseline(self) -> float:
        """The most the data path and sync fixes alone give at this batch: minimal / baseline samples/s."""
        return _paired_ratio(self.minimal, self.baseline)

    def gpufill_over_minimal(self) -> float:
        """What gpufill adds beyond those fixes (precision, compile, batch search; ~1 on a CPU)."""
        return _paired_ratio(self.gpufill, self.minimal)

    def quality_ratio(self) -> float:
        """Mean validation loss over seeds, gpufill / baseline (one seed's batch order moves it by ~10 %)."""
        return statistics.fmean(m.val_loss for m in self.gpufill) / statistics.fmean(m.val_loss for m in self.baseline)

    def over(self, other: str) -> float:
        """Median over pairs of gpufill / `other` (one of `others`) samples/s."""
        return _paired_ratio(self.gpufill, self.others[other])

    def rows(self) -> list[dict[str, Any]]:
        """Baseline, gpufill, the minimal loop if run, the other loops, then each variant: the median-speed run of each (see `_summarise`)."""
        loops = (self.baseline, self.gpufill, *((self.minimal,) if self.minimal else ()), *self.others.values(), *self.variants.values())
        return [_summarise(runs).row() for runs in loops]


def _paired_ratio(numerator: list[LoopMeasurement], denominator: list[LoopMeasurement]) -> float:
    return statistics.median(n.samples_per_s / d.samples_per_s for n, d in zip(numerator, denominator, strict=True))


# One loop's run: (training data, epochs, seed) -> its measurement.
_Runner = Callable[[Data, int, int], LoopMeasurement]


def compare(
    make_model: Callable[[], nn.Module],
    train: Data,
    val: Data,
    *,
    epochs: int,
    loss: Any = "mse",
    lr: float = DEFAULTS.lr,
    batch_size: int = 128,
    micro_batch: int | None = None,
    fit_options: Mapping[str, Any] | None = None,
    device: str = "auto",
    repeats: int = 1,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    meter: UtilisationMeter | None = None,
    progress: Callable[[str], None] | None = None,
    minimal: bool = False,
    hand_tuned: bool = False,
    lightning: bool = False,
) -> Comparison:
    """Baseline, gpufill and each variant, interleaved `repeats` times from the same initial weights.

    The order rotates from round to round (see below); run i of every loop uses seed i.
    Every loop minimises `loss` at `lr`; the baseline feeds batches of `batch_size` (of
    `micro_batch`, accumulated, when given); gpufill gets `fit_options` (FitConfig fields; its
    automatic plan for the rest).

    `variants` maps a name to FitConfig overrides (e.g. {"data_placement": "loader"}) for a
    gpufill run with those settings; `minimal` adds the careful hand-written fp32 loop (tensor
    data only), `hand_tuned` the same loop with the guides' settings (bf16 where fast, TF32,
    compile), `lightning` Lightning's Trainer ((inputs, targets) tensors); `meter` adds each run's
    GPU utilisation; `progress` is told which run starts.
    """
    variants = dict(variants or {})
    options = dict(fit_options or {})
    known = {field.name for field in dataclasses.fields(FitConfig)}
    for name, overrides in {"fit_options": options, **variants}.items():
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InputError(f"{name!r} changes unknown setting(s) {', '.join(unknown)}", field="variants" if name in variants else "fit_options",
                             fix="use FitConfig fields")
    if minimal and as_source(train, "train").kind != "tensors":
        raise InputError("the hand loop indexes tensors held in memory, and this training's data is a Dataset or a loader", field="hand_loop",
                         fix="leave the hand loop out (hand_loop=False, --no-hand-loop)")
    target = str(resolve_device(device))
    say = progress or (lambda _text: None)
    comparison = Comparison(baseline=[], gpufill=[], variants={name: [] for name in variants})
    if hand_tuned:
        comparison.others["hand loop, tuned"] = []
    if lightning:
        comparison.others["lightning"] = []

    def gpufill_runner(name: str, overrides: Mapping[str, Any]) -> _Runner:
        def run(data: Data, epochs: int, seed: int) -> LoopMeasurement:
            config = FitConfig(**{"device": target, "seed": seed, "loss": loss, "lr": lr, **options, **overrides})
            return gpufill_fit(make_model(), data, val, epochs=epochs, config=config, name=name)
        return run

    def minimal_runner(data: Data, epochs: int, seed: int) -> LoopMeasurement:
        return minimal_measured(make_model(), data, val, epochs=epochs, device=target, seed=seed, loss=loss, lr=lr, batch_size=batch_size)

    def tuned_runner(data: Data, epochs: int, seed: int) -> LoopMeasurement:
        return minimal_measured(make_model(), data, val, epochs=epochs, device=target, seed=seed, loss=loss, lr=lr, batch_size=batch_size,
                                tuned=True, name="hand loop, tuned")

    def lightning_runner(data: Data, epochs: int, seed: int) -> LoopMeasurement:
        return lightning_measured(make_model(), data, val, epochs=epochs, device=target, seed=seed, loss=loss, lr=lr, batch_size=batch_size)

    other_runners = {"hand loop, tuned": tuned_runner, "lightning": lightning_runner}

    def baseline_runner(data: Data, epochs: int, seed: int) -> LoopMeasurement:
        return baseline_fit(make_model(), data, val, epochs=epochs, loss=loss, lr=lr, batch_size=batch_size, micro_batch=micro_batch,
                            device=target, seed=seed)

    loops: list[tuple[str, list[LoopMeasurement], _Runner]] = [
        ("baseline", comparison.baseline, baseline_runner),
        ("gpufill", comparison.gpufill, gpufill_runner("gpufill", {})),
        *((("minimal", comparison.minimal, minimal_runner),) if minimal else ()),
        *((name, runs, other_runners[name]) for name, runs in comparison.others.items()),
        *((name, comparison.variants[name], gpufill_runner(name, overrides)) for name, overrides in variants.items()),
    ]
    say("warm-up (untimed)")
    # Untimed: lazy init, allocator and kernel caches. Enough samples for every loop's batch: an automatic batch keeps 4
    # steps per epoch, so a variant pinning a micro-batch of 128 needs 512 (on 256 it once met an automatic batch of 64).
    largest = max([batch_size, *(int(o[k]) for o in (options, *variants.values()) for k in ("batch_size", "micro_batch")
                                 if isinstance(o.get(k), int))])
    warm = head(train, 4 * largest)
    for _name, _runs, run in loops:
        run(warm, 1, 0)
    for seed in range(repeats):
        # Each round starts one loop later: over len(loops) rounds every loop runs once in every
        # position, so a position's advantage (warm caches, a neighbour's garbage) cancels out.
        shift = seed % len(loops)
        for name, runs, run in loops[shift:] + loops[:shift]:
            say(f"round {seed + 1}/{repeats}: {name}")
            runs.append(_metered(meter, run, train, epochs, seed))
    return comparison


def _summarise(runs: list[LoopMeasurement]) -> LoopMeasurement:
    """The median-speed run, with the mean validation loss and GPU utilisation and the peak memory over all runs."""
    median = sorted(runs, key=lambda m: m.samples_per_s)[len(runs) // 2]
    peaks = [m.peak_memory_mib for m in runs if m.peak_memory_mib is not None]
    utilisation = [m.gpu_util for m in runs if m.gpu_util is not None]
    return dataclasses.replace(
        median,
        val_loss=statistics.fmean(m.val_loss for m in runs),
        val_loss_runs=[m.val_loss for m in runs],
        samples_per_s_runs=[m.samples_per_s for m in runs],
        peak_memory_mib=max(peaks) if peaks else None,
        gpu_util=statistics.fmean(utilisation) if utilisation else None,
    )
