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

import copy
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpufill.engine import losses
from gpufill.engine.backend import backend_flags, synchronize
from gpufill.engine.batches import _Resident, map_tensors, rows, signature
from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import detect
from gpufill.engine.inputs import Source, data_facts
from gpufill.engine.loop import Status
from gpufill.engine.measure.candidates import thread_counts
from gpufill.engine.measure.thread_watch import ThreadWatch
from gpufill.engine.optim import Multiplier, make_optimizer, make_schedule
from gpufill.engine.optim_eager import eager_class
from gpufill.engine.packs.optim import StackedAdam
from gpufill.engine.packs.direct import direct_forward
from gpufill.engine.packs.stacked import StackedModule
from gpufill.engine.packs.stacked_optim import StackedOptimizer, recipe_of, why_not_stacked_optimizer
from gpufill.engine.plan import Plan, make_plan
from gpufill.engine.prepare import total_steps
from gpufill.engine.result import EpochRecord, FitResult, throughput


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
        cfg, k, device = self.cfg, self.k, self.device
        stacked = StackedModule.from_models(self.models).to(device)
        self.build_s = time.perf_counter() - started
        optimizer, optimizer_choice = self.stacked_optimizer(list(stacked.parameters()))
        multiplier = _multiplier(cfg, self.total_steps)
        schedule = make_schedule(_schedule_holder(), cfg, self.total_steps)[1]
        generators = [torch.Generator(device=device).manual_seed(c.seed) for c in self.configs]
        torch.manual_seed(self.configs[0].seed)  # dropout: each model draws its own masks in the pack
        active = [True] * k
        """Which models still train: decided on the host at an epoch's end (early stopping, divergence)."""
        state = _Best(k, stacked)
        histories: list[list[EpochRecord]] = [[] for _ in range(k)]
        status: list[Status] = ["completed"] * k
        events: list[list[str]] = [[f"trained in a pack of {k} variants ({self.form})"] for _ in range(k)]
        seconds: list[float] = []
        samples: list[int] = []
        """Each epoch's seconds (the pack's) and samples trained (each model's; a cut last epoch: what it trained)."""
        step_count = 0
        watch: ThreadWatch | None = None
        """Re-checks the thread count when the steps drift (a CPU with threads left to gpufill), once measuring is done."""
        if multiplier is not None:
            optimizer.set_lr_factor(multiplier(0))
        for epoch in range(1, cfg.epochs + 1):
            tick = time.perf_counter()
            stacked.train()
            order = torch.stack([torch.randperm(self.n, device=device, generator=g) for g in generators])
            sums: dict[str, torch.Tensor] = {}
            training = [i for i in range(k) if active[i]]
            epoch_steps = epoch_samples = 0
            for start in range(0, self.n, self.batch):
                if step_count >= self.total_steps:
                    break  # max_steps reached: the epoch is cut where fit alone cuts it
                size = min(self.batch, self.n - start)
                index = order[:, start : start + size]
                batch = _gather(self.train_data, index)
                if probe is None or probe.done:
                    if watch is None:
                        measured = probe.timing if probe is not None else None
                        watch = ThreadWatch(self.thread_candidates(), self.plan.threads.value,
                                            measured.pack_step_s if measured is not None else step_s)
                    step_started = time.perf_counter()
                    values = pack_step(stacked, optimizer, self.loss_fn, batch, training, cfg.grad_clip)
                    watch.observe(time.perf_counter() - step_started)  # a CPU step is done when it returns: no sync to time it
                else:  # the first steps: timed against one model alone (the probe decides, or stops the pack)
                    values = probe.timed(lambda: pack_step(stacked, optimizer, self.loss_fn, batch, training, cfg.grad_clip), batch)
                for name, value in values.items():
                    weighted = value.detach().float() * size
                    sums[name] = sums[name] + weighted if name in sums else weighted
                step_count += 1
                epoch_steps += 1
                epoch_samples += size
                if multiplier is not None:
                    optimizer.set_lr_factor(multiplier(step_count))
            train_values = {name: (total / max(epoch_samples, 1)).tolist() for name, total in sums.items()}  # the epoch's one read
            seconds.append(time.perf_counter() - tick)
            samples.append(epoch_samples)
            last = epoch == cfg.epochs or step_count >= self.total_steps
            validate = self.val_data is not None and (epoch % cfg.validate_every == 0 or last)
            val_values = self._validate(stacked) if validate else None
            was_active, lrs = list(active), list(optimizer.lr)
            for i in range(k):
                if not was_active[i]:
                    continue
                train_loss = train_values["loss"][i]
                val_loss = val_values["loss"][i] if val_values is not None else None
                record = EpochRecord(epoch=epoch, train_loss=train_loss, val_loss=val_loss, seconds=seconds[-1] / k, lr=lrs[i],
                                     train_metrics={n: v[i] for n, v in train_values.items() if n != "loss"},
                                     val_metrics=None if val_values is None else {n: v[i] for n, v in val_values.items() if n != "loss"},
                                     samples=epoch_samples, steps=epoch_steps)
                histories[i].append(record)
                if not math.isfinite(train_loss) or (val_loss is not None and not math.isfinite(val_loss)):
                    status[i] = "diverged"
                    events[i].append(f"diverged at epoch {epoch}: masked, the rest of the pack went on")
                    active[i] = False
                elif val_loss is not None and state.early_stop(i, val_loss, epoch, cfg):
                    status[i] = "early_stopped"
                    events[i].append(f"early stop at epoch {epoch}: no improvement for {cfg.patience} validations")
                    active[i] = False
                elif last and epoch < cfg.epochs:
                    events[i].append(f"stopped at max_steps {cfg.max_steps} in epoch {epoch} ({epoch_steps} of its steps)")
            state.keep_improved(stacked)
            state.keep_stopped([i for i in training if not active[i]], stacked)
            if not any(active) or last:
                break
        state.put_back_stopped(stacked)  # a stopped model's buffers (BatchNorm statistics) as they were when it stopped
        if cfg.restore_best:
            restored = state.restore(stacked, status)
            for i in restored:
                events[i].append(f"restored the best weights (epoch {state.best_epoch[i]}, val loss {state.best_val[i]:.6g})")
        self.probe_s = probe.budget.spent_s if probe is not None else 0.0
        if choice is None:
            choice = probe.choice if probe.choice is not None else Choice(k, f"one pack of {k} ({self.form}): its training ended before "
                                                                              "the measurement was clear")
        plan = self.plan.replace(pack_size=choice, optimizer=optimizer_choice, schedule=schedule)
        if watch is not None and watch.log:
            plan = plan.replace(threads=Choice(watch.threads, f"{watch.threads}: re-checked while training ({'; '.join(watch.log)})"))
            for i in range(k):
                events[i].extend(f"threads: {line}" for line in watch.log)
        return [self._result(i, stacked, plan, histories[i], status[i], events[i], state, seconds, samples, time.perf_counter() - started)
                for i in range(k)]

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

    def _result(self, i: int, stacked: StackedModule, plan: Plan, history: list[EpochRecord], status: Status, events: list[str], state: _Best,
                seconds: list[float], samples: list[int], wall: float) -> FitResult:
        samples_per_s, epoch_s = throughput([s / self.k for s in seconds], samples)  # this model's share of the pack's time
        metrics: dict[str, float | int | None] = {
            "train_loss": history[-1].train_loss if history else None,
            "val_loss": state.best_val[i] if state.best_epoch[i] is not None else None,
            "best_epoch": state.best_epoch[i],
            "epochs_run": len(history),
        }
        if history:
            metrics.update({f"train_{name}": value for name, value in history[-1].train_metrics.items()})
            best = next((r for r in history if r.epoch == state.best_epoch[i]), None)
            scored = best or next((r for r in reversed(history) if r.val_metrics is not None), None)
            if scored is not None and scored.val_metrics:
                metrics.update({f"val_{name}": value for name, value in scored.val_metrics.items()})
        timings = {"samples_per_s": samples_per_s, "epoch_s": epoch_s, "train_s": sum(seconds) / self.k,
                   "pack_train_s": sum(seconds), "pack_size": self.k, "wall_s": wall, "probe_s": self.probe_s}
        # The model variant i was stacked from, given its trained weights: no copy of the module per variant.
        return FitResult(model=stacked.write_into(i, self.models[i]), plan=plan, history=history, metrics=metrics, timings=timings, events=events, status=status)


class _Best:
    """Per-model early stopping and best weights, as `fit` keeps them for one model."""

    def __init__(self, k: int, stacked: StackedModule):
        self.best_val = [math.inf] * k
        self.best_epoch: list[int | None] = [None] * k
        self.bad = [0] * k
        self.improved = [False] * k
        self.state = {name: t.detach().clone() for name, t in stacked.state_dict().items()}
        self.stopped: list[bool] = [False] * k
        self.at_stop = {name: t.detach().clone() for name, t in stacked.state_dict().items()}
        """Each stopped model's weights and buffers when it stopped: the pack's later forwards still
        move a stopped model's running statistics, which its training alone would never have run."""

    def early_stop(self, i: int, val: float, epoch: int, cfg: FitConfig) -> bool:
        if val < self.best_val[i] - cfg.min_delta:
            self.best_val[i], self.best_epoch[i], self.bad[i], self.improved[i] = val, epoch, 0, True
            return False
        self.bad[i] += 1
        return cfg.patience is not None and self.bad[i] >= cfg.patience

    def keep_improved(self, stacked: StackedModule) -> None:
        if any(self.improved):
            _copy_where(self.improved, source=stacked.state_dict(), target=self.state)
        self.improved = [False] * len(self.improved)

    def keep_stopped(self, models: list[int], stacked: StackedModule) -> None:
        if models:
            rows_ = [i in models for i in range(len(self.stopped))]
            _copy_where(rows_, source=stacked.state_dict(), target=self.at_stop)
            self.stopped = [a or b for a, b in zip(self.stopped, rows_, strict=True)]

    def put_back_stopped(self, stacked: StackedModule) -> None:
        if any(self.stopped):
            _copy_where(self.stopped, source=self.at_stop, target=stacked.state_dict())

    def restore(self, stacked: StackedModule, status: Sequence[Status]) -> list[int]:
        chosen = [e is not None and s != "diverged" for e, s in zip(self.best_epoch, status, strict=True)]
        if any(chosen):
            _copy_where(chosen, source=self.state, target=stacked.state_dict())
        return [i for i, c in enumerate(chosen) if c]


@torch.no_grad()
def _copy_where(rows_: list[bool], *, source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
    """target[name][i] = source[name][i] for each chosen model i: one copy per tensor, not one per model (64 models'
    best weights kept per epoch were 1,500 small copies, 9 % of the call)."""
    if all(rows_):
        for name, tensor in target.items():
            tensor.copy_(source[name])
        return
    chosen: torch.Tensor | None = None
    for name, tensor in target.items():
        if chosen is None or chosen.device != tensor.device:
            chosen = torch.tensor([i for i, c in enumerate(rows_) if c], dtype=torch.long, device=tensor.device)
        tensor.index_copy_(0, chosen, source[name].index_select(0, chosen))


def _gather(data: _Resident, index: torch.Tensor) -> Any:
    """Each model's rows: leaves (N, ...) indexed by (K, b) -> (K, b, ...), one index_select of the flattened index
    per leaf (4x advanced indexing's speed on a CPU: 0.08 vs 0.34 ms for 16 x 256 rows of 64 floats)."""
    flat = index.reshape(-1)
    picked = [leaf.index_select(0, flat).view(*index.shape, *leaf.shape[1:]) for leaf in data.leaves]
    return tuple(picked) if data.plain_tuple else torch.utils._pytree.tree_unflatten(picked, data.spec)


def _resident(data: Any, device: torch.device, dtype: torch.dtype) -> Any:
    return map_tensors(lambda leaf: leaf.to(device, dtype=dtype) if leaf.dtype == torch.float64 else leaf.to(device), data)


def _plan(plan: Plan) -> Plan:
    batch = plan.effective_batch.value
    return plan.replace(
        precision=Choice("fp32", "fp32: a pack of variants trains in fp32 (its precision is not measured yet)"),
        compile=Choice(False, "off: a pack of variants steps eagerly"),
        step_graph=Choice(False, "off: a pack of variants steps eagerly"),
        data_placement=Choice("device", "a pack gathers each model's batch from resident tensors"),
        loader=Choice(None, "no DataLoader: pack data is resident"),
        loader_tuning=Choice(False, "off: pack data is resident"),
        micro_batch=Choice(batch, "the whole batch per step (packs do not accumulate)"),
        accumulation=Choice(1, "1: no accumulation in packs"),
        batch_search=Choice(False, "off in packs: every variant keeps its batch"),
        grad_scaler=Choice(False, "off: fp32"),
    )


def _multiplier(cfg: FitConfig, total_steps: int) -> Callable[[int], float] | None:
    """The schedule's lr factor per optimizer step (the same for every variant: they share the length)."""
    if callable(cfg.schedule):
        return cfg.schedule
    if cfg.schedule == "constant":
        return None
    scheduler, _ = make_schedule(_schedule_holder(), cfg, total_steps)
    lambdas = scheduler.lr_lambdas[0]
    assert isinstance(lambdas, Multiplier)
    return lambdas


def _schedule_holder() -> torch.optim.Optimizer:
    """A one-parameter optimizer a schedule's multiplier is read from (never stepped; eager: no torch._dynamo import)."""
    return eager_class(torch.optim.SGD)([nn.Parameter(torch.zeros(1))], lr=1.0)
