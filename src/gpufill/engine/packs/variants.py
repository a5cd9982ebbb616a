"""Variants of one model trained as one pack: `fit_many`'s training when it packs.

The variants' parameters and buffers are stacked (`StackedModule`, torch.func's vmap over
`functional_call`) and stepped by the optimizer each variant's `fit` would build (`stacked_optimizer`:
torch's AdamW kernel called directly for the default AdamW, torch's own class over row runs of the
stacked tensors for any other elementwise optimizer); each model is trained as `fit` trains it alone: its own seed's batch order, its
own early stopping and best weights, the same schedule, clipping per model, metrics per model.
A model that stops (early stopping, divergence) is no longer stepped, and its weights and
buffers are kept as they were when it stopped. `variants_measure.py` times the pack against one
model alone, at each thread count a CPU training could use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpufill.engine import losses
from gpufill.engine.backend import backend_flags
from gpufill.engine.batches import _Resident, map_tensors, rows, signature
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import detect
from gpufill.engine.inputs import Source, data_facts
from gpufill.engine.measure.candidates import thread_counts
from gpufill.engine.measure.thread_watch import ThreadWatch
from gpufill.engine.optim import make_optimizer, schedule_multiplier
from gpufill.engine.packs.optim import StackedAdam
from gpufill.engine.packs.direct import direct_forward
from gpufill.engine.packs.pack_plan import resident_plan
from gpufill.engine.packs.stacked import StackedModule
from gpufill.engine.packs.stacked_optim import StackedOptimizer, recipe_of, why_not_stacked_optimizer
from gpufill.engine.plan import Plan, make_plan
from gpufill.engine.prepare import total_steps
from gpufill.engine.result import EpochRecord, FitResult, throughput
from gpufill.engine.epochs import BestWeights, Rules, Stopping, Trained, run_epochs


PackOptimizer = StackedAdam | StackedOptimizer


def pack_step(stacked: StackedModule, optimizer: PackOptimizer, loss_fn: Callable[[Any, Any], dict[str, torch.Tensor]], batch: Any,
              models: Sequence[int], grad_clip: float | None = None) -> dict[str, torch.Tensor]:
    """One optimizer step of `models` (the ones still training), each on its own rows of `batch`
    (leaves (K, b, ...)); returns the per-model values (K,), no host sync. The others run forward
    and backward with the pack (vmap cannot leave a model out) but are not stepped. A model whose
    loss turns non-finite steps on, as `fit` alone does: the epoch's end finds it diverged."""
    values = stacked.per_model(loss_fn, batch)
    values["loss"].sum().backward()  # the models are independent: each gets its own loss's gradient
    if grad_clip is not None:
        _clip_per_model(optimizer.params, grad_clip)
    optimizer.step(models)
    optimizer.zero_grad()
    return values


@torch.no_grad()
def _clip_per_model(params: Sequence[nn.Parameter], max_norm: float) -> None:
    """clip_grad_norm_ for every model of the pack: each model's total gradient norm, its own scale."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # (parameters, K)
    total = torch.linalg.vector_norm(norms, dim=0)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))


class PackedVariants:
    """The variants as one StackedModule on resident data, trained like `fit` trains each alone."""

    def __init__(self, models: Sequence[nn.Module], configs: Sequence[FitConfig], train: Source, val: Source | None):
        self.cfg = cfg = configs[0]
        self.configs = configs
        self.k = len(models)
        self.hardware = hardware = detect(cfg.device)
        self.device = device = torch.device(hardware.device)
        self.plan = _plan(make_plan(hardware, data_facts(train, val, None), cfg, epochs=cfg.epochs))
        self.batch = self.plan.effective_batch.value
        dtype = next((p.dtype for p in models[0].parameters() if p.is_floating_point()), torch.float32)
        self.train_data = _Resident(_resident(train.data, device, dtype))
        self.n = int(train.n or 0)
        self.val_data = _Resident(_resident(val.data, device, dtype)) if val is not None else None
        self.n_val = int(val.n or 0) if val is not None else 0
        self.models = [m.to(device) for m in models]
        self.loss_fn, loss_choice = losses.resolve(cfg.loss)
        self.plan = self.plan.replace(loss=loss_choice)
        self.steps_per_epoch = -(-self.n // self.batch)
        # Each variant's optimizer as its fit alone would build it: what the pack must step.
        # eager: a pack of variants compiles nothing, so its optimizers skip torch's lazy torch._dynamo import (~1 s).
        built = [make_optimizer(m, c, c.lr * self.plan.lr_scale.value, self.plan.optimizer_kernel.value, eager=True)
                 for m, c in zip(self.models, configs, strict=True)]
        self.optimizers = [optimizer for optimizer, _ in built]
        self.recipes = [recipe_of(o, m) for o, m in zip(self.optimizers, self.models, strict=True)]
        self.optimizer_choice = built[0][1]
        self.total_steps = total_steps(self.steps_per_epoch, cfg) or 0
        """Optimizer steps per model: the epochs', or max_steps where it ends them first (as `fit` counts them)."""
        self.sample_signature = signature(rows(train.data, 0, min(8, self.n or 1)))
        self.build_s = 0.0
        """Seconds building the stacked module took (a one-time cost of the pack)."""

    @property
    def form(self) -> str:
        """How the pack runs its models, in words."""
        direct = direct_forward(self.models[0])
        if direct is None:
            return "torch.func vmap"
        return "direct grouped convolutions and batched matrix products" if getattr(direct, "convolves", False) else "direct batched matrix products"

    def why_not(self) -> str | None:
        """None when the variants' optimizers step correctly as one pack; else why not."""
        return why_not_stacked_optimizer(self.models, self.optimizers, self.recipes, elementwise_known=self.steps_fused_adam)

    @property
    def steps_fused_adam(self) -> bool:
        """fit's own Adam or AdamW on its fused kernel: the pack calls that kernel over the stacked tensors (StackedAdam),
        elementwise by construction and pinned against torch's per-model Adam by tests/engine/test_many.py."""
        return self.cfg.optimizer in ("adam", "adamw") and self.plan.optimizer_kernel.value == "fused"

    def stacked_optimizer(self, params: Sequence[nn.Parameter]) -> tuple[PackOptimizer, Choice[str]]:
        """The pack's optimizer over the stacked `params`, with the plan's record of it. fit's Adam and AdamW call
        torch's fused kernel directly (StackedAdam: no Python optimizer loop per step); any other optimizer is torch's
        own class over row runs of the stacked tensors (StackedOptimizer), the same arithmetic as alone."""
        recipes = self.recipes
        if self.steps_fused_adam:
            optimizer: PackOptimizer = StackedAdam(list(params), [float(r.groups[0][1]["lr"]) for r in recipes],
                                                   [self.configs[i].weight_decay for i in range(self.k)], decoupled=self.cfg.optimizer == "adamw")
            how = f"torch's fused {recipes[0].kind.__name__} kernel called directly over the stacked models (StackedAdam)"
        else:
            optimizer = StackedOptimizer(params, recipes)
            how = f"torch's {recipes[0].kind.__name__} over the stacked models, one call per run of models sharing every hyperparameter"
        return optimizer, Choice(self.optimizer_choice.value, f"{self.optimizer_choice.reason}; in the pack: {how}")

    # -- measured: engine/packs/variants_measure.py times the pack against one model at a time ---------
    def thread_candidates(self) -> list[int]:
        """The plan's thread count first, then 1 and every core (CPU, threads left to gpufill)."""
        current = self.plan.threads.value
        if self.device.type != "cpu" or self.cfg.threads != "auto":
            return [current]
        return thread_counts(current, self.hardware.cpu_count)

    # -- training ------------------------------------------------------------------------------
    def train(self, choice: Choice[int] | None, probe: Any = None, step_s: float | None = None) -> list[FitResult]:
        """Train the pack. `choice`: why it packs; None with a `probe` (variants_measure.StepProbe), which times the
        first steps and decides (raising its PackSlower to stop a pack that would be slower in all). `step_s`: a steady
        pack step measured earlier (a cached timing), what the thread watch compares the steps with."""
        with backend_flags(self.plan):  # the measured threads, restored after
            return self._train(choice, probe, step_s)

    def _train(self, choice: Choice[int] | None, probe: Any, step_s: float | None) -> list[FitResult]:
        started = time.perf_counter()
        k = self.k
        stacked = StackedModule.from_models(self.models).to(self.device)
        self.build_s = time.perf_counter() - started
        optimizer, optimizer_choice = self.stacked_optimizer(list(stacked.parameters()))
        schedule = schedule_multiplier(self.cfg, self.total_steps)[1]
        stopping = Stopping(k, Rules.of(self.cfg), packed=True, events=[[f"trained in a pack of {k} variants ({self.form})"] for _ in range(k)])
        rows = _VariantRows(self, stacked, optimizer, stopping, probe, step_s)
        histories: list[list[EpochRecord]] = [[] for _ in range(k)]
        run_epochs(rows, stopping, histories)
        rows.finish()
        self.probe_s = probe.budget.spent_s if probe is not None else 0.0
        if choice is None:
            choice = probe.choice if probe.choice is not None else Choice(k, f"one pack of {k} ({self.form}): its training ended before "
                                                                              "the measurement was clear")
        plan = self.plan.replace(pack_size=choice, optimizer=optimizer_choice, schedule=schedule)
        watch = rows.watch
        if watch is not None and watch.log:
            plan = plan.replace(threads=Choice(watch.threads, f"{watch.threads}: re-checked while training ({'; '.join(watch.log)})"))
            for events in stopping.events:
                events.extend(f"threads: {line}" for line in watch.log)
        wall = time.perf_counter() - started
        return [self._result(i, stacked, plan, histories[i], stopping, rows.seconds, rows.samples, wall) for i in range(k)]

    @torch.no_grad()
    def _validate(self, stacked: StackedModule) -> dict[str, list[float]]:
        stacked.eval()
        assert self.val_data is not None
        sums: dict[str, torch.Tensor] = {}
        chunk = max(4 * self.batch, 1024)
        for start in range(0, self.n_val, chunk):
            stop = min(start + chunk, self.n_val)
            values = stacked.per_model(self.loss_fn, self.val_data.slice(start, stop), shared_batch=True)
            for name, value in values.items():
                weighted = value.float() * (stop - start)
                sums[name] = sums[name] + weighted if name in sums else weighted
        return {name: (total / self.n_val).tolist() for name, total in sums.items()}

    def _result(self, i: int, stacked: StackedModule, plan: Plan, history: list[EpochRecord], stopping: Stopping, seconds: list[float],
                samples: list[int], wall: float) -> FitResult:
        samples_per_s, epoch_s = throughput([s / self.k for s in seconds], samples)  # this model's share of the pack's time
        metrics = stopping.row_metrics(i, history)
        timings = {"samples_per_s": samples_per_s, "epoch_s": epoch_s, "train_s": sum(seconds) / self.k,
                   "pack_train_s": sum(seconds), "pack_size": self.k, "wall_s": wall, "probe_s": self.probe_s}
        # The model variant i was stacked from, given its trained weights: no copy of the module per variant.
        return FitResult(model=stacked.write_into(i, self.models[i]), plan=plan, history=history, metrics=metrics, timings=timings,
                         events=stopping.events[i], status=stopping.status[i])


class _VariantRows:
    """The variants as the epoch loop (engine/epochs.py) drives them: each row one variant, a stopped one no longer
    stepped, its weights and buffers put back at the end as they were when it stopped (the pack's later forwards still
    move a stopped model's running statistics, which its training alone would never have run)."""

    def __init__(self, variants: PackedVariants, stacked: StackedModule, optimizer: PackOptimizer, stopping: Stopping, probe: Any,
                 step_s: float | None):
        self.variants, self.stacked, self.optimizer, self.stopping, self.probe, self.step_s = variants, stacked, optimizer, stopping, probe, step_s
        cfg = variants.cfg
        self.has_validation = variants.val_data is not None
        self.generators = [torch.Generator(device=variants.device).manual_seed(c.seed) for c in variants.configs]
        torch.manual_seed(variants.configs[0].seed)  # dropout: each model draws its own masks in the pack
        self.multiplier = schedule_multiplier(cfg, variants.total_steps)[0]  # the same for every variant: they share the length
        if self.multiplier is not None:
            optimizer.set_lr_factor(self.multiplier(0))
        self.best = BestWeights(stacked.state_dict, stacked=True)
        self.at_stop = BestWeights(stacked.state_dict, stacked=True)
        self.stopped: list[int] = []
        self.step_count = 0
        self.seconds: list[float] = []
        self.samples: list[int] = []
        """Each epoch's seconds (the pack's) and samples trained (each model's; a cut last epoch: what it trained)."""
        self.watch: ThreadWatch | None = None
        """Re-checks the thread count when the steps drift (a CPU with threads left to gpufill), once measuring is done."""

    def train_epoch(self, epoch: int, steps_left: Sequence[int] | None) -> Trained:
        v, k = self.variants, self.variants.k
        tick = time.perf_counter()
        self.stacked.train()
        order = torch.stack([torch.randperm(v.n, device=v.device, generator=g) for g in self.generators])
        training = self.stopping.training
        limit = None if steps_left is None else min(steps_left[i] for i in training)  # the variants step together
        sums: dict[str, torch.Tensor] = {}
        steps = samples = 0
        for start in range(0, v.n, v.batch):
            if limit is not None and steps >= limit:
                break  # max_steps reached: the epoch is cut where fit alone cuts it
            size = min(v.batch, v.n - start)
            batch = _gather(v.train_data, order[:, start : start + size])
            values = self._step(batch, training)
            for name, value in values.items():
                weighted = value.detach().float() * size
                sums[name] = sums[name] + weighted if name in sums else weighted
            self.step_count += 1
            steps += 1
            samples += size
            if self.multiplier is not None:
                self.optimizer.set_lr_factor(self.multiplier(self.step_count))
        values_by_row = {name: (total / max(samples, 1)).tolist() for name, total in sums.items()}  # the epoch's one read
        seconds = time.perf_counter() - tick
        self.seconds.append(seconds)
        self.samples.append(samples)
        return Trained(values=values_by_row, samples=[samples] * k, steps=[steps] * k, seconds=seconds / k)

    def _step(self, batch: Any, training: list[int]) -> dict[str, torch.Tensor]:
        v, probe = self.variants, self.probe
        step = lambda: pack_step(self.stacked, self.optimizer, v.loss_fn, batch, training, v.cfg.grad_clip)  # noqa: E731
        if probe is not None and not probe.done:  # the first steps: timed against one model alone (the probe decides, or stops the pack)
            return probe.timed(step, batch)
        if self.watch is None:
            measured = probe.timing if probe is not None else None
            self.watch = ThreadWatch(v.thread_candidates(), v.plan.threads.value, measured.pack_step_s if measured is not None else self.step_s)
        started = time.perf_counter()
        values = step()
        self.watch.observe(time.perf_counter() - started)  # a CPU step is done when it returns: no sync to time it
        return values

    def validate(self) -> dict[str, Sequence[float]]:
        return self.variants._validate(self.stacked)

    def lrs(self) -> Sequence[float]:
        return list(self.optimizer.lr)

    def keep_best(self, rows: Sequence[int]) -> None:
        self.best.keep(rows)

    def epoch_end(self, epoch: int, records: dict[int, EpochRecord], ending: set[int]) -> dict[int, str]:
        return {}  # fit_many's variants have no pruner

    def after_epoch(self, epoch: int, last: bool) -> None:
        newly = [i for i, status in enumerate(self.stopping.status) if status != "completed" and i not in self.stopped]
        self.at_stop.keep(newly)
        self.stopped += newly

    def finish(self) -> None:
        self.at_stop.restore(self.stopped)  # a stopped model's buffers (BatchNorm statistics) as they were when it stopped
        self.stopping.restore_best(self.best)


def _gather(data: _Resident, index: torch.Tensor) -> Any:
    """Each model's rows: leaves (N, ...) indexed by (K, b) -> (K, b, ...), one index_select of the flattened index
    per leaf (4x advanced indexing's speed on a CPU: 0.08 vs 0.34 ms for 16 x 256 rows of 64 floats)."""
    flat = index.reshape(-1)
    picked = [leaf.index_select(0, flat).view(*index.shape, *leaf.shape[1:]) for leaf in data.leaves]
    return tuple(picked) if data.plain_tuple else torch.utils._pytree.tree_unflatten(picked, data.spec)


def _resident(data: Any, device: torch.device, dtype: torch.dtype) -> Any:
    return map_tensors(lambda leaf: leaf.to(device, dtype=dtype) if leaf.dtype == torch.float64 else leaf.to(device), data)


def _plan(plan: Plan) -> Plan:
    return resident_plan(plan, placement="a pack gathers each model's batch from resident tensors").replace(
        precision=Choice("fp32", "fp32: a pack of variants trains in fp32 (its precision is not measured yet)"),
        compile=Choice(False, "off: a pack of variants steps eagerly"),
        step_graph=Choice(False, "off: a pack of variants steps eagerly"),
        grad_scaler=Choice(False, "off: fp32"),
    )
