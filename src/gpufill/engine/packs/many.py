"""`fit_many`: variants of one model (seeds, learning rates, weight decays) trained at once.

Each variant is what `fit(make_model(), train, val, seed=..., lr=...)` would train alone: its
initial weights are `torch.manual_seed(seed); make_model()`, its batches the permutation
`fit` draws from that seed. Where that is correct and measured faster, the variants train as
one pack of any architecture (`packs/variants.py`); otherwise one after another through
`fit`, the reason in each plan's `pack_size`. Packs reproduce the separate trainings
to float rounding: `tests/engine/test_many.py` says so, weights within 1e-5. A bias whose gradient
is zero (a Linear's before a BatchNorm) drifts apart by rounding instead: `test_many_limits.py` says what holds there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from gpufill.engine import losses
from gpufill.engine.batches import rows, signature, to_device
from gpufill.engine.choice import Choice
from gpufill.engine.loggers import open_loggers, parse_loggers
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import resolve_device
from gpufill.engine.inputs import Source, as_source
from gpufill.engine.loop import fit
from gpufill.engine.packs.stacked import why_not_stacked
from gpufill.engine.measure.cache import TuneCache, clear_memory
from gpufill.engine.measure.resolver import MIN_GAIN
from gpufill.engine.packs.builds import Builds, pack_chunk
from gpufill.engine.packs.decide import GOAL_SHARE, MIN_MEASURED_STEPS, decide
from gpufill.engine.packs.variants import PackedVariants
from gpufill.engine.packs.variants_measure import PackSlower, StepProbe, cached_timing
from gpufill.engine.prepare import resolve_config
from gpufill.engine.result import FitResult
from gpufill.errors import InputError
from gpufill.files import make_folder

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
             config: FitConfig | None = None, pack: bool | str = "auto", keep_models: bool = True, loggers: Sequence[str] | str | None = None,
             **settings: Any) -> list[FitResult]:
    """Train one model per variant; results in the order of `variants`, each as `fit` would return it alone.

    `make_model()` is called once per variant after `torch.manual_seed(variant's seed)`, as late as the training
    allows (one at a time: one model ahead; packed: a pack's worth), and each variant trains its own tensors
    (`packs/builds.py`); `variants` are dicts of fit settings (seed, lr, weight_decay, ... ) laid over `settings`.
    `pack`: "auto" packs where correct and measured faster; True where correct (no measurement);
    False trains one at a time. A pack larger than the memory free is split into packs that fit.
    `checkpoint_dir`: each variant checkpoints in its own `variant-<index>` folder there.
    `keep_models`: False lets each trained model go (its result's model is None): a sweep read for its metrics
    holds one model at a time, not K.
    `loggers`: as fit's ("tensorboard:DIR", "mlflow:URI"), one run per variant (`variant-<index>`), written as each
    variant's part of the sweep finishes.
    """
    if pack not in ("auto", True, False):
        raise InputError(f"pack={pack!r}", field="pack", fix="use 'auto', True or False")
    configs = [resolve_config(config, {**settings, **variant}) for variant in _checked_variants(variants)]
    builds = Builds(make_model, [cfg.seed for cfg in configs])
    train_source = as_source(train, "train")
    val_source = as_source(val, "val") if val is not None else None
    reason = _why_not_by_settings(configs, train_source, val_source) if pack is not False else "pack=False"
    configs = _own_checkpoints(configs)
    size, why_split = (len(configs), None) if reason is not None else pack_chunk(builds.peek(), configs[0], len(configs))
    wanted = parse_loggers(loggers)  # refused before anything trains
    results: list[FitResult] = []
    for start in range(0, len(configs), size):
        part = configs[start : start + size]
        results.extend(_fit_part(builds, part, train, val, train_source, val_source, pack, reason, why_split, keep_models))
        for index in range(start, len(results)):
            for logger in open_loggers(wanted, run_name=f"variant-{index}"):
                logger.replay(results[index])
    return results


def _fit_part(builds: Builds, configs: Sequence[FitConfig], train: Any, val: Any, train_source: Source, val_source: Source | None,
              pack: bool | str, reason: str | None, why_split: str | None, keep_models: bool) -> list[FitResult]:
    """The variants of `configs`: one pack where correct (and, under "auto", measured faster), else one at a time
    (`reason`, when given, says why already)."""
    if reason is not None:
        return _one_at_a_time(builds, configs, train, val, Choice(1, f"one at a time: {reason}"), 0.0, keep_models)
    models = builds.take(len(configs))
    note = f"; {why_split}" if why_split else ""
    measured_s = 0.0
    reason = _why_one_at_a_time(models, configs, train_source, val_source)
    run = PackedVariants(models, configs, train_source, val_source) if reason is None else None
    if run is not None:
        reason = run.why_not()
    results: list[FitResult] | None = None
    if run is not None and reason is None and pack is True:
        results = run.train(Choice(len(models), f"one pack of {len(models)} ({run.form}): pack=True, not measured{note}"))
    elif run is not None and reason is None:
        cache = TuneCache(configs[0].tune_cache)
        timing = cached_timing(run, cache)
        if timing is None and run.total_steps < MIN_MEASURED_STEPS:
            reason = (f"only {run.total_steps} optimizer steps per model: measuring a pack costs two of its steps, more than "
                      f"{GOAL_SHARE:.0%} of so short a training (pack=True packs it unmeasured)")
        elif timing is None:  # measured on the pack's own first steps: a pack that would be slower in all is stopped
            try:
                results = run.train(None, probe=StepProbe(run, cache))
            except PackSlower as slower:
                reason, measured_s = str(slower), slower.spent_s
        else:
            chosen, why = decide(timing, run.total_steps, pack_built=False, min_gain=MIN_GAIN)
            if chosen:
                results = run.train(Choice(len(models), f"{why} ({run.form}; measured earlier for this shape on this machine){note}"),
                                    step_s=timing.pack_step_s)
            reason = why
    if results is not None:
        for result in results:
            result.model = result.model if keep_models else None
        return results
    del run
    return _one_at_a_time(iter(models), configs, train, val, Choice(1, f"one at a time: {reason}"), measured_s, keep_models)


def _one_at_a_time(models: Builds | Iterator[nn.Module], configs: Sequence[FitConfig], train: Any, val: Any, choice: Choice[int],
                   measured_s: float, keep_models: bool) -> list[FitResult]:
    results = []
    for cfg in configs:  # no name holds the model past its fit: with keep_models=False it is gone before the next is built
        fitted = fit(models.take(1)[0] if isinstance(models, Builds) else next(models), train, val, config=cfg)
        fitted.plan = fitted.plan.replace(pack_size=choice)
        fitted.timings["pack_probe_s"] = measured_s / len(configs)  # this variant's share of measuring the pack it did not join
        fitted.model = fitted.model if keep_models else None
        results.append(fitted)
    return results


def _checked_variants(variants: Any) -> list[dict[str, Any]]:
    """`variants` as a list of dicts of fit settings, or one line naming what is wrong."""
    fix = "pass variants=[{'seed': 0}, {'seed': 1}, ...]: a list of dicts of fit settings"
    if isinstance(variants, str | bytes | Mapping) or not isinstance(variants, Sequence):
        raise InputError(f"variants is a {type(variants).__name__}, not a list of dicts", field="variants", fix=fix)
    if not variants:
        raise InputError("fit_many got no variants", field="variants", fix=fix)
    for index, variant in enumerate(variants):
        if not isinstance(variant, Mapping):
            raise InputError(f"variants[{index}] is {variant!r} (a {type(variant).__name__}), not a dict of fit settings", field="variants",
                             fix=fix)
        if not all(isinstance(name, str) for name in variant):
            raise InputError(f"variants[{index}] has a key that is not a setting name: {variant!r}", field="variants", fix=fix)
    return [dict(variant) for variant in variants]


def _own_checkpoints(configs: list[FitConfig]) -> list[FitConfig]:
    """Each variant's checkpoints in a folder of its own, `checkpoint_dir/variant-<index>`: in one folder each would
    overwrite the one before, and a resume would continue every variant from the last one's checkpoint."""
    if all(cfg.checkpoint_dir is None for cfg in configs):
        return configs
    own = []
    for index, cfg in enumerate(configs):
        if cfg.checkpoint_dir is not None:  # gpufill's own folder below the one given: a link or a file in its place is refused
            folder = make_folder(Path(cfg.checkpoint_dir) / f"variant-{index}", field="checkpoint_dir", inside=cfg.checkpoint_dir)
            cfg = dataclasses.replace(cfg, checkpoint_dir=folder)
        own.append(cfg)
    return own


def _why_not_by_settings(configs: Sequence[FitConfig], train: Source, val: Source | None) -> str | None:
    """Why the variants cannot train as one pack, known from their settings and data alone (no model built); None."""
    if len(configs) < 2:
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
    return None


def _why_one_at_a_time(models: Sequence[nn.Module], configs: Sequence[FitConfig], train: Source, val: Source | None) -> str | None:
    """None when these variants' models can train as one pack; else why not."""
    if len(models) < 2:
        return "one variant"
    cfg = configs[0]
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
