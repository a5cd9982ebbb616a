"""`fit_many`'s measurement: a pack of the variants against one model alone, as the training would run them.

The pack is the one training will use (all K models, built once: training reuses it, its initial weights put back);
one model alone is a copy of variant 0 with the optimizer its `fit` would build. Each way's first step is timed
apart from its steady steps (`decide.PackTiming`); steady steps alternate between the ways at the plan's thread count
until the answer is clear or a share of the planned training is spent (`decide.MeasureBudget`, which counts the
building and first steps too), then a CPU's other thread counts get two steps of each way while the budget lasts. The numbers are cached per model shape, batch, K, optimizer and machine (`TuneCache`, in
this process and in `tune_cache` when set): the next call of the same shape measures nothing.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch

from gpufill.engine.backend import backend_flags, synchronize
from gpufill.engine.batches import signature
from gpufill.engine.choice import Choice
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.measure.resolver import MIN_GAIN
from gpufill.engine.packs.decide import MeasureBudget, PackTiming
from gpufill.engine.packs.stacked import StackedModule
from gpufill.engine.packs.variants import PackedVariants, _gather, pack_step


def pack_timing(run: PackedVariants, cache: TuneCache, clock: Callable[[], float] = time.perf_counter) -> tuple[PackTiming, bool]:
    """(the costs, whether the pack was built and stepped now: its one-time cost is then spent). The run's plan gets
    the pack's thread count with its reason."""
    index = torch.arange(min(run.batch, run.n), device=run.device).expand(run.k, -1)
    batch = _gather(run.train_data, index)
    key = shape_key("pack-variants", run.models[0], signature(batch), run.hardware.name, k=run.k, batch=run.batch,
                    optimizer=type(run.optimizers[0]).__name__, loss=getattr(run.loss_fn, "name", "fn"), threads=run.cfg.threads,
                    torch=torch.__version__)
    cached = cache.get(key)
    if cached is not None:
        timing = PackTiming.from_dict(cached)
        _keep_threads(run, timing.threads, "measured earlier in this process or its tune cache")
        return timing, False
    timing = _measure(run, batch, clock)
    cache.put(key, timing.to_dict())
    return timing, True


def _measure(run: PackedVariants, batch: object, clock: Callable[[], float]) -> PackTiming:
    tick = clock()
    stacked = StackedModule.from_models(run.models).train()
    optimizer, _ = run.stacked_optimizer(list(stacked.parameters()))
    initial = {name: t.detach().clone() for name, t in stacked.state_dict().items()}
    build_s = clock() - tick
    everyone = list(range(run.k))

    def packed() -> None:
        pack_step(stacked, optimizer, run.loss_fn, batch, everyone)

    alone, single = copy.deepcopy([run.models[0], run.optimizers[0]])  # variant 0 and the optimizer its fit builds, on copies
    alone.train()
    one_batch = torch.utils._pytree.tree_map(lambda leaf: leaf[0] if isinstance(leaf, torch.Tensor) else leaf, batch)

    def one_step() -> None:
        run.loss_fn(alone, one_batch)["loss"].backward()
        single.step()
        single.zero_grad(set_to_none=True)

    counts = run.thread_candidates()
    pack_s: dict[int, list[float]] = {t: [] for t in counts}
    alone_s: dict[int, list[float]] = {t: [] for t in counts}
    budget = MeasureBudget(run.k, run.total_steps)
    with _threads(run, counts[0]):
        first_pack, first_alone = _once(packed, run.device, clock), _once(one_step, run.device, clock)
        budget.spent_s += clock() - tick
        while not budget.done():  # steady pairs at the plan's thread count until the answer is clear
            started = clock()
            pack_s[counts[0]].append(_once(packed, run.device, clock))
            alone_s[counts[0]].append(_once(one_step, run.device, clock))
            budget.add(pack_s[counts[0]][-1], alone_s[counts[0]][-1], clock() - started)
    for t in counts[1:]:  # other thread counts of a CPU, while the budget lasts: two steps of each way
        if budget.spent_s + 2 * (budget.pack[-1] + budget.alone[-1]) > max(budget.budget_s, 0.0):
            break
        with _threads(run, t):
            started = clock()
            for _ in range(2):
                pack_s[t].append(_once(packed, run.device, clock))
                alone_s[t].append(_once(one_step, run.device, clock))
            budget.spent_s += clock() - started
    tried = [t for t in counts if pack_s[t]]
    stacked.load_state_dict(initial)  # the pack trains from its variants' initial weights and buffers
    run.built = stacked
    pack_threads = _fastest({t: statistics.median(pack_s[t]) for t in tried}, counts[0])
    alone_threads = _fastest({t: statistics.median(alone_s[t]) for t in tried}, counts[0])
    pack_step_s, alone_step_s = statistics.median(pack_s[pack_threads]), statistics.median(alone_s[alone_threads])
    if len(tried) > 1:
        versus = ", ".join(f"{t}: {statistics.median(pack_s[t]) * 1e3:.3g} ms" for t in tried)
        _keep_threads(run, pack_threads, f"the pack's step measured at {versus}")
    elif len(counts) > 1:
        _keep_threads(run, pack_threads, f"the plan's count; no budget left to time {', '.join(map(str, counts[1:]))} (a short training)")
    return PackTiming(k=run.k, pack_step_s=pack_step_s, alone_step_s=alone_step_s, pack_once_s=build_s + max(0.0, first_pack - pack_step_s),
                      alone_once_s=max(0.0, first_alone - alone_step_s), threads=pack_threads, pairs=len(budget.pack))


def _keep_threads(run: PackedVariants, threads: int, why: str) -> None:
    if run.device.type == "cpu" and run.cfg.threads == "auto":
        run.plan = run.plan.replace(threads=Choice(threads, f"{threads}: {why}"))


def _threads(run: PackedVariants, threads: int) -> object:
    return backend_flags(run.plan.replace(threads=Choice(threads, "measuring")))


def _fastest(seconds: dict[int, float], incumbent: int) -> int:
    """The fastest thread count; the incumbent unless another is at least MIN_GAIN faster (the probe's rule)."""
    best = min(seconds, key=seconds.__getitem__)
    return best if seconds[best] * MIN_GAIN <= seconds[incumbent] else incumbent


def _once(step: Callable[[], None], device: torch.device, clock: Callable[[], float]) -> float:
    synchronize(device)
    tick = clock()
    step()
    synchronize(device)
    return clock() - tick
