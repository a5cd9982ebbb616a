"""`fit_many`: variants of one model (seeds, learning rates, weight decays) trained at once.

Each variant is what `fit(make_model(), train, val, seed=..., lr=...)` would train alone: its
initial weights are `torch.manual_seed(seed); make_model()`, its batches the permutation
`fit` draws from that seed. Where that is correct and measured faster, the variants train as
one pack of any architecture (`packs/variants.py`); otherwise one after another through
`fit`, the reason in each plan's `pack_size`. Packs reproduce the separate trainings
to float rounding: `tests/engine/test_many.py` says so, weights within 1e-5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpufill.engine import losses
from gpufill.engine.batches import rows, signature, to_device
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import resolve_device
from gpufill.engine.inputs import Source, as_source, check_model
from gpufill.engine.loop import fit
from gpufill.engine.packs.stacked import why_not_stacked
from gpufill.engine.measure.cache import TuneCache, clear_memory
from gpufill.engine.measure.resolver import MIN_GAIN
from gpufill.engine.packs.decide import BUDGET_SHARE, MIN_MEASURED_STEPS, decide
from gpufill.engine.packs.variants import PackedVariants
from gpufill.engine.packs.variants_measure import PackSlower, StepProbe, cached_timing
from gpufill.engine.prepare import resolve_config
from gpufill.engine.result import FitResult
from gpufill.errors import InputError

PER_VARIANT = frozenset({"seed", "lr", "weight_decay", "optimizer"})
"""Settings that may differ between the variants of one pack: its optimizer holds them per model (an optimizer of
another class than the first variant's is refused by the optimizer check, with the reason)."""
_CHECKED: dict[tuple[Any, ...], str | None] = {}
"""The checked step's verdict per model class, shapes, loss and batch structure: one check per shape and process."""


def clear_caches() -> None:
    """Forget every verdict and measurement this process holds (a benchmark charges each call its own)."""
    _CHECKED.clear()
    clear_memory()

def fit_many(make_model: Callable[[], nn.Module], train: Any, val: Any = None, *, variants: Sequence[dict[str, Any]],
             config: FitConfig | None = None, pack: bool | str = "auto", **settings: Any) -> list[FitResult]:
    """Train one model per variant; results in the order of `variants`, each as `fit` would return it alone.

    `make_model()` is called once per variant after `torch.manual_seed(variant's seed)`;
    `variants` are dicts of fit settings (seed, lr, weight_decay, ... ) laid over `settings`.
    `pack`: "auto" packs where correct and measured faster; True where correct (no measurement);
    False trains one at a time.
    """
    if pack not in ("auto", True, False):
        raise InputError(f"pack={pack!r}", field="pack", fix="use 'auto', True or False")
    if not variants:
        raise InputError("fit_many got no variants", field="variants", fix="pass variants=[{'seed': 0}, {'seed': 1}, ...]")
    configs = [resolve_config(config, {**settings, **dict(variant)}) for variant in variants]
    models = [_seeded(make_model, cfg.seed) for cfg in configs]
    train_source = as_source(train, "train")
    val_source = as_source(val, "val") if val is not None else None
    measured_s = 0.0
    reason = _why_one_at_a_time(models, configs, train_source, val_source) if pack is not False else "pack=False"
    run = PackedVariants(models, configs, train_source, val_source) if reason is None else None
    if run is not None:
        reason = run.why_not()
    if run is not None and reason is None and pack is True:
        return run.train(Choice(len(models), f"one pack of {len(models)} ({run.form}): pack=True, not measured"))
    if run is not None and reason is None:
        cache = TuneCache(configs[0].tune_cache)
        timing = cached_timing(run, cache)
        if timing is None and run.total_steps < MIN_MEASURED_STEPS:
            reason = (f"only {run.total_steps} optimizer steps per model: measuring a pack costs two of its steps, more than "
                      f"{BUDGET_SHARE:.0%} of so short a training (pack=True packs it unmeasured)")
        elif timing is None:  # measured on the pack's own first steps: a pack that would be slower in all is stopped
            try:
                return run.train(None, probe=StepProbe(run, cache))
            except PackSlower as slower:
                reason, measured_s = str(slower), slower.spent_s
        else:
            chosen, why = decide(timing, run.total_steps, pack_built=False, min_gain=MIN_GAIN)
            if chosen:
                return run.train(Choice(len(models), f"{why} ({run.form}; measured earlier for this shape on this machine)"), step_s=timing.pack_step_s)
            reason = why
    choice = Choice(1, f"one at a time: {reason}")
    results = []
    for model, cfg in zip(models, configs, strict=True):
        fitted = fit(model, train, val, config=cfg)
        fitted.plan = fitted.plan.replace(pack_size=choice)
        fitted.timings["pack_probe_s"] = measured_s / len(models)  # this variant's share of measuring the pack it did not join
        results.append(fitted)
    return results


def _seeded(make_model: Callable[[], nn.Module], seed: int) -> nn.Module:
    _seed(seed)
    model = make_model()
    if not isinstance(model, nn.Module):
        raise InputError(f"make_model returned a {type(model).__name__}, not a torch.nn.Module", field="make_model",
                         fix="pass a function of no arguments that builds the model, e.g. lambda: MyNet(width=64)")
    check_model(model, "make_model")
    return model


def _seed(seed: int) -> None:
    """torch.manual_seed(seed). Where no accelerator is there to seed, its CPU generator directly: torch.manual_seed
    also queues a lazy seeding of CUDA, XPU and MPS, each capturing a stack trace (about 1 ms a call inside a
    training; 64 variants paid 70 ms), and the CPU's random stream is the same either way."""
    accelerators = torch.cuda.is_available() or torch.backends.mps.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if accelerators:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _why_one_at_a_time(models: Sequence[nn.Module], configs: Sequence[FitConfig], train: Source, val: Source | None) -> str | None:
    """None when the variants can train as one pack; else why not."""
    if len(models) < 2:
        return "one variant"
    first = dataclasses.asdict(configs[0])
    for cfg in configs[1:]:
        differ = sorted(name for name, value in dataclasses.asdict(cfg).items() if name not in PER_VARIANT and value != first[name])
        if differ:
            return f"the variants differ in {', '.join(differ)} (a pack shares all but {', '.join(sorted(PER_VARIANT))})"
    cfg = configs[0]
    if train.kind != "tensors" or (val is not None and val.kind != "tensors"):
        return "the data is a Dataset or DataLoader (a pack gathers each model's batch from tensors)"
    if cfg.checkpoint_dir is not None or cfg.resume:
        return "checkpoints are per training"
    if cfg.steps_per_epoch is not None:
        return "steps_per_epoch is set (a pack runs whole epochs of resident data)"
    if cfg.precision not in ("auto", "fp32") or cfg.compile not in ("auto", False) or cfg.micro_batch != "auto":
        return "a precision, compile or micro-batch was requested (a pack runs fp32 steps of the whole batch)"
    loss_fn, _ = losses.resolve(cfg.loss)
    # Checked where the pack would train: the models and the data may still be elsewhere (a user's CPU model
    # with data already on the GPU, or the reverse); the pack moves both.
    device = resolve_device(cfg.device)
    sample = to_device(rows(train.data, 0, min(8, train.n or 1)), device)
    model = models[0]
    # The loss itself in the key (a function by identity, kept alive here: an id could be reused by another one).
    key = (type(model), tuple((name, tuple(t.shape), t.dtype) for name, t in [*model.named_parameters(), *model.named_buffers()]),
           cfg.loss, signature(sample), str(device))
    try:
        return _CHECKED[key] if key in _CHECKED else _CHECKED.setdefault(key, why_not_stacked(models, loss_fn, sample, device=device))
    except TypeError:  # an unhashable loss object: checked every time
        return why_not_stacked(models, loss_fn, sample, device=device)
