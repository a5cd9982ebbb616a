"""Training a fused pack: K same-shape models, each on its own data, with its own lr and seed.

Each model draws the batches plain `fit` would draw for it (its own seeded permutation of
its own windows, the same batch size), so a pack reproduces K separate trainings up to
float rounding. Per model: learning rate and weight decay (a fused AdamW that takes them
as tensors: torch's optimizers take one scalar lr per group), early stopping by masking
(a stopped model gets no further updates; its best weights are kept), and divergence: a
model whose loss turns NaN/inf is masked and reported, the others go on.
The hot loop never reads the device: masks and losses stay on it until the epoch ends.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpufill.engine.config import REGRESSION_LOSSES, FitConfig
from gpufill.engine.result import EpochRecord, FitResult
from gpufill.engine.hardware import detect
from gpufill.engine.packs.fused import FusedModule
from gpufill.engine.packs.stacked import pack_kind, pack_module
from gpufill.engine.packs.optim import PACK_OPTIMIZERS, PackAdamW, PackSGD, pack_optimizer
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.packs.probe import PackProbe, configure
from gpufill.engine.measure.resolver import resolve
from gpufill.engine.plan import Choice, DataFacts, Plan, make_plan
from gpufill.engine.backend import backend_flags
from gpufill.engine.precision import Precision
from gpufill.engine.batches import signature
from gpufill.engine.losses import per_sample_regression
from gpufill.engine.packs.pack_plan import PACK_CONTEXT, PACK_OPTIMIZER_REASONS, pack_plan
from gpufill.engine.packs.pack_data import Pair, PackData, orders, padded
from gpufill.engine.packs.reform import MEASURED_STEPS, REFORM_MODES, decide, needs_measurement, survivors_optimizer

PACK_LOSSES = REGRESSION_LOSSES
"""The named regression losses a pack computes per sample and masks per model."""


MemberWatch = Callable[[int, Callable[[], torch.Tensor]], "str | None"]
"""(epoch, a getter of the member's validation predictions (N_val, ...), in the pack's scaled units) -> a reason to stop."""


@dataclass(frozen=True, slots=True)
class PackMember:
    """One model of a pack: its data and its own training settings."""

    train: Pair
    val: Pair | None
    lr: float
    weight_decay: float
    seed: int
    watch: MemberWatch | None = None
    """Asked after each epoch but the last (validation data given): a reason to stop this member there (status
    "pruned": a search's pruner), or None. It stops changing, as an early-stopped member does; the others go on."""


def fit_pack(models: Sequence[nn.Module], members: Sequence[PackMember], *, config: FitConfig, kind: str | None = None,
             reform: str = "measured") -> list[FitResult]:
    """Train `models` (same class and shapes) as one fused pack of `kind` (None: the default kind,
    `packs.stacked.pack_kind`); one FitResult per model. `reform`: when members stop early, whether the pack goes on
    with its survivors alone (packs/reform.py: measured, always or never)."""
    if reform not in REFORM_MODES:
        raise ValueError(f"reform is one of {', '.join(REFORM_MODES)}, not {reform!r}")
    if not (isinstance(config.loss, str) and config.loss in PACK_LOSSES):
        raise ValueError(f"a pack trains on a regression loss ({', '.join(PACK_LOSSES)}), not {config.loss!r}: train these models one by one")
    if config.schedule != "constant":
        raise ValueError(f"a pack runs a constant lr, not schedule {config.schedule!r}: train these models one by one")
    if not (isinstance(config.optimizer, str) and config.optimizer in PACK_OPTIMIZERS):
        raise ValueError(f"a pack steps {', '.join(PACK_OPTIMIZERS)}, not optimizer {config.optimizer!r}: train these models one by one")
    k = len(models)
    counts = [int(m.train[0].shape[0]) for m in members]
    total_bytes = sum(t.numel() * t.element_size() for m in members for pair in (m.train, m.val) if pair is not None for t in pair)
    hardware = detect(config.device)
    facts = DataFacts(n_train=max(counts), bytes_total=total_bytes)
    plan = pack_plan(make_plan(hardware, facts, config, epochs=config.epochs))
    batch = plan.effective_batch.value
    device = torch.device(plan.device.value)
    kind = kind or pack_kind(models[0])
    fused = pack_module(models, kind).to(device)
    x, y = padded([m.train for m in members], device)
    val = [m.val for m in members]
    has_val = all(v is not None and v[0].shape[0] > 0 for v in val)
    vx, vy = padded(val, device) if has_val else (None, None)
    n = torch.tensor(counts, device=device)
    n_val = torch.tensor([v[0].shape[0] for v in val], device=device) if has_val else None
    lr = torch.tensor([m.lr * plan.lr_scale.value for m in members], device=device)
    optimizer = pack_optimizer(config.optimizer, list(fused.parameters()), lr, torch.tensor([m.weight_decay for m in members], device=device))
    plan = plan.replace(optimizer=Choice(config.optimizer, PACK_OPTIMIZER_REASONS[config.optimizer]))
    generators = [torch.Generator(device=device).manual_seed(m.seed) for m in members]
    torch.manual_seed(members[0].seed)  # dropout
    precision = Precision(plan.precision.value, device, loss_scaling=plan.grad_scaler.value, masked=True)
    data = PackData(x=x, y=y, n=n, counts=counts, batch=batch, vx=vx, vy=vy, n_val=n_val)
    run = _PackRun(fused, optimizer, precision, config, data, device)
    run.watches = [m.watch for m in members]
    run.kind, run.reform = kind, reform
    requested = {name: getattr(config, name) for name in ("precision", "tf32", "cudnn_benchmark", "compile", "cuda_graph", "threads")}
    key = shape_key("pack-plan", models[0], signature((x[0, :1], y[0, :1])), hardware.name, k=k, batch=batch, loss=config.loss,
                    cores=hardware.cpu_count, threads_now=torch.get_num_threads(), torch=torch.__version__, **requested)
    events: list[str] = []
    plan = resolve(plan, PackProbe(run), settings=config, hardware=hardware, facts=facts, context=PACK_CONTEXT,
                   total_steps=run.steps_per_epoch * config.epochs, cache=TuneCache(config.tune_cache), key=key, events=events)
    with backend_flags(plan):
        plan = run.plan = configure(run, plan)
        for member_events in run.events:
            member_events[:0] = events
        histories, status, seconds = run.train(generators)
        models_out = [fused.unfuse(i) for i in range(k)]
    steady = statistics.median(seconds[1:] or seconds)  # the first epoch pays warm-up
    timings = {
        "pack_size": k,
        "epoch_s": steady / k,  # this model's share of the pack's time
        "samples_per_s": sum(counts) / steady,
        "train_s": sum(seconds) / k,
        "pack_train_s": sum(seconds),
    }
    results = []
    for i in range(k):
        best_epoch = run.best_epoch[i]
        results.append(
            FitResult(
                model=models_out[i],
                plan=plan,
                history=histories[i],
                metrics={
                    "train_loss": histories[i][-1].train_loss if histories[i] else None,
                    "val_loss": run.best_val[i] if best_epoch is not None else None,
                    "best_epoch": best_epoch,
                    "epochs_run": len(histories[i]),
                },
                timings=dict(timings),
                events=run.events[i] + [f"trained in a pack of {k} ({kind})"],
                status=status[i],
            )
        )
    return results


class _PackRun:
    def __init__(self, fused: FusedModule, optimizer: PackAdamW | PackSGD, precision: Precision, config: FitConfig, data: PackData, device: torch.device):
        self.fused, self.optimizer, self.precision, self.cfg, self.data, self.device = fused, optimizer, precision, config, data, device
        self.k = k = len(data.counts)
        self.forward: Callable[[torch.Tensor], torch.Tensor] = fused
        self.compiled = False
        self.graph: torch.cuda.CUDAGraph | None = None
        """The whole step captured (CUDA): replayed instead of `step` when set."""
        self.active = torch.ones(k, dtype=torch.bool, device=device)
        self.rows = torch.arange(k, device=device).unsqueeze(1)
        # The step's inputs are static buffers filled by copy, so a captured step reads new batches:
        # each model's sample indices, and their positions in its permutation (past its own count,
        # or past the padded width for the last, short batch: masked).
        width = data.x.shape[1]
        self.steps_per_epoch = -(-width // data.batch)
        self.index = torch.zeros(k, data.batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(data.batch, dtype=torch.long, device=device)
        self._all_positions = torch.arange(self.steps_per_epoch * data.batch, device=device)
        self.loss_sum = torch.zeros(k, device=device)
        """The epoch's per-model sum of sample losses, added to by every step on the device."""
        self.finite = torch.ones(k, dtype=torch.bool, device=device)
        self._zero = torch.zeros((), device=device)
        self.best_val = [math.inf] * k
        self.best_epoch: list[int | None] = [None] * k
        self.bad = [0] * k
        self.best_state = {name: t.detach().clone() for name, t in fused.state_dict().items()}
        self.events: list[list[str]] = [[] for _ in range(k)]
        self.lrs = optimizer.lr.tolist()
        self.watches: list[MemberWatch | None] = [None] * k
        self.training = k
        """Members still training when the pack last considered re-forming (it considers again when fewer are)."""
        self.kind: str | None = None
        self.reform = "never"
        self.plan: Plan | None = None

    def use_compiled(self, mode: Any = "default") -> None:
        self.forward = torch.compile(self.fused) if mode in (True, "default") else torch.compile(self.fused, mode=mode)
        self.compiled = True

    def use_eager(self) -> None:
        self.forward, self.compiled = self.fused, False

    def load_batch(self, order: torch.Tensor, start: int) -> None:
        """Columns start..start+batch of `order` (K, width) into the static index buffer (padded past the width)."""
        batch, width = self.data.batch, order.shape[1]
        taken = min(batch, width - start)
        self.index[:, :taken].copy_(order[:, start : start + taken])
        if taken < batch:
            self.index[:, taken:].zero_()
        self.positions.copy_(self._all_positions[start : start + batch])

    def step(self) -> None:
        """One optimizer step on the loaded batch; adds each model's loss to the epoch's sums. On the device, no sync."""
        d = self.data
        valid = self.positions.unsqueeze(0) < d.n.unsqueeze(1)  # (K, b): past a model's own windows, or padding
        with self.precision.autocast():
            prediction = self.forward(d.x[self.rows, self.index])
        per_sample = per_sample_regression(self.cfg.loss, prediction.float(), d.y[self.rows, self.index].float())
        count = valid.sum(dim=1)
        per_model = (per_sample * valid).sum(dim=1) / count.clamp(min=1)
        ok = torch.isfinite(per_model)
        has_samples = count > 0
        step_active = self.active & has_samples & ok
        self.precision.backward(torch.where(step_active, per_model, self._zero).sum())
        # A model not stepping (stopped, diverged, no samples) may have NaN gradients (0 x inf in its backward):
        # its row is zeroed before the loss scaler looks, so it cannot skip every other model's step.
        gradients = torch.where(step_active.unsqueeze(1), self.optimizer.gradients(), self._zero)
        finite_grads = self.precision.finite_after_unscale([gradients])  # fp16: an overflowed step is skipped
        self.optimizer.step(step_active if finite_grads is None else step_active & finite_grads, gradients)
        self.optimizer.zero_grad()
        self.finite &= ok | ~has_samples
        self.loss_sum += torch.where(ok, per_model.detach() * count, self._zero)

    def _advance(self, order: torch.Tensor, start: int) -> None:
        self.load_batch(order, start)
        if self.graph is not None:
            self.graph.replay()
            return
        try:
            self.step()
        except Exception as error:  # a compile error surfaces at the first call: eager is always correct
            if not self.compiled:
                raise
            self.use_eager()
            self.optimizer.zero_grad()
            for events in self.events:
                events.append(f"compile failed ({type(error).__name__}); the pack fell back to eager")
            self.step()

    def train(self, generators: Sequence[torch.Generator]) -> tuple[list[list[EpochRecord]], list[str], list[float]]:
        """Every epoch (the pack re-formed from its survivors where that measures faster); each member's history,
        its status and the pack's epoch seconds."""
        histories: list[list[EpochRecord]] = [[] for _ in range(self.k)]
        status = ["completed"] * self.k
        seconds: list[float] = []
        self._epochs(1, generators, histories, status, seconds)
        if self.cfg.restore_best and any(e is not None for e in self.best_epoch):
            restore = torch.tensor([e is not None and s != "diverged" for e, s in zip(self.best_epoch, status, strict=True)], device=self.device)
            self._copy_where(restore, source=self.best_state, target=self.fused.state_dict())
            for i in range(self.k):
                if bool(restore[i]):
                    self.events[i].append(f"restored the best weights (epoch {self.best_epoch[i]}, val loss {self.best_val[i]:.6g})")
        return histories, status, seconds

    def _epochs(self, first: int, generators: Sequence[torch.Generator], histories: list[list[EpochRecord]], status: list[str],
                seconds: list[float]) -> None:
        """Epochs `first`.. of this pack; where members stopped and a smaller pack measures faster, the rest are the
        smaller pack's, its members' weights and state written back here at the end."""
        k, d = self.k, self.data
        own_seconds: list[float] = []
        for epoch in range(first, self.cfg.epochs + 1):
            tick = time.perf_counter()
            order = orders(generators, d.counts, d.x.shape[1], self.device)
            self.loss_sum.zero_()
            self.finite.fill_(True)
            self.fused.train()
            for start in range(0, d.x.shape[1], d.batch):
                self._advance(order, start)
            train_loss = (self.loss_sum / d.n.clamp(min=1)).tolist()  # the epoch's one read
            own_seconds.append(time.perf_counter() - tick)
            seconds.append(own_seconds[-1])
            val_loss = self._validate(d.vx, d.vy, d.n_val) if d.vx is not None and (epoch % self.cfg.validate_every == 0 or epoch == self.cfg.epochs) else None
            was_active = self.active.tolist()
            finite_list = self.finite.tolist()
            for i in range(k):
                if not was_active[i]:
                    continue
                record = EpochRecord(epoch=epoch, train_loss=train_loss[i], val_loss=None if val_loss is None else val_loss[i], seconds=seconds[-1] / k, lr=self.lrs[i])
                histories[i].append(record)
                if not finite_list[i] or (val_loss is not None and not math.isfinite(val_loss[i])):
                    status[i] = "diverged"
                    self.events[i].append(f"diverged at epoch {epoch}: masked, the rest of the pack went on")
                    self.active[i] = False
                elif val_loss is not None and self._early_stop(i, val_loss[i], epoch):
                    status[i] = "early_stopped"
                    self.events[i].append(f"early stop at epoch {epoch}: masked, no improvement for {self.cfg.patience} validations")
                    self.active[i] = False
            if epoch < self.cfg.epochs and d.vx is not None and any(self.watches):
                self._watch(epoch, status)
            self._keep_best(val_loss, was_active)
            if not bool(self.active.any()):
                return
            smaller = self._reformed(epoch, min(own_seconds)) if epoch < self.cfg.epochs else None
            if smaller is not None:
                keep, run = smaller
                self._let_go()
                d = order = None  # type: ignore[assignment]  # this frame's references too: the smaller pack trains from here
                kept_status = [status[i] for i in keep]
                run._epochs(epoch + 1, [generators[i] for i in keep], [histories[i] for i in keep], kept_status, seconds)
                self._take_back(run, keep, kept_status, status)
                return

    def _reformed(self, epoch: int, masked_epoch_s: float) -> tuple[list[int], _PackRun] | None:
        """Where members stopped at `epoch`: the members still training as a smaller pack ready to go on, when that
        measures faster than going on masked (packs/reform.py); the decision is an event of every member's."""
        keep = [i for i, on in enumerate(self.active.tolist()) if on]
        if len(keep) >= self.training:
            return None
        self.training = len(keep)
        epochs_left = self.cfg.epochs - epoch
        run, reformed_epoch_s, build_s = None, None, 0.0
        if self.reform == "always" or needs_measurement(self.reform, self.steps_per_epoch * epochs_left):
            tick = time.perf_counter()
            run = self._survivors(keep)
            build_s = time.perf_counter() - tick
            if self.reform == "measured":
                measured = PackProbe(run).measure(self.plan, timed_steps=MEASURED_STEPS, check=False)
                if measured.step_s is not None:
                    reformed_epoch_s, build_s = measured.step_s * run.steps_per_epoch, build_s + measured.setup_s
        decision = decide(mode=self.reform, k=self.k, kept=len(keep), epoch=epoch, epochs_left=epochs_left,
                          masked_epoch_s=masked_epoch_s, reformed_epoch_s=reformed_epoch_s, build_s=build_s)
        for events in self.events:
            events.append(decision.event)
        if not decision.reform or run is None:
            return None
        run.plan = configure(run, self.plan)
        return keep, run

    def _survivors(self, keep: list[int]) -> _PackRun:
        """A pack of the members `keep` alone, each carrying on exactly where it is: its weights, optimizer moments and
        steps, best weights and early-stopping count, data and watch (its events are the same list)."""
        fused = pack_module([self.fused.unfuse(i) for i in keep], self.kind).to(self.device)
        optimizer = survivors_optimizer(self.cfg.optimizer, self.optimizer, list(fused.parameters()), keep)
        run = _PackRun(fused, optimizer, self.precision, self.cfg, self.data.rows(keep), self.device)
        rows = torch.tensor(keep, device=self.device)
        with torch.no_grad():
            for name, tensor in run.best_state.items():
                tensor.copy_(self.best_state[name][rows])
        run.best_val, run.best_epoch, run.bad = ([values[i] for i in keep] for values in (self.best_val, self.best_epoch, self.bad))
        run.events, run.watches = [self.events[i] for i in keep], [self.watches[i] for i in keep]
        run.kind, run.reform, run.plan = self.kind, self.reform, self.plan
        return run

    def _let_go(self) -> None:
        """What the smaller pack now holds for itself, freed here (on a GPU the two packs would otherwise share its
        memory): the optimizer's moments, the data, the captured step. Weights and best weights stay: the survivors'
        come back into them, the stopped members' are kept in them."""
        empty = torch.empty(0, device=self.device)
        for name in ("exp_avg", "exp_avg_sq", "buffer"):
            if hasattr(self.optimizer, name):
                setattr(self.optimizer, name, empty)
        self.data = PackData(x=empty, y=empty, n=empty, counts=[], batch=self.data.batch, vx=None, vy=None, n_val=None)
        self.graph = None

    def _take_back(self, run: _PackRun, keep: list[int], kept_status: list[str], status: list[str]) -> None:
        """The smaller pack's members back into their rows here: weights, best weights, early-stopping state, status."""
        rows = torch.tensor(keep, device=self.device)
        with torch.no_grad():
            theirs = run.fused.state_dict()
            for name, tensor in self.fused.state_dict().items():
                tensor[rows] = theirs[name]
            for name, tensor in self.best_state.items():
                tensor[rows] = run.best_state[name]
            self.active[rows] = run.active
        for j, i in enumerate(keep):
            status[i], self.best_val[i], self.best_epoch[i], self.bad[i] = kept_status[j], run.best_val[j], run.best_epoch[j], run.bad[j]

    def _watch(self, epoch: int, status: list[str]) -> None:
        """Ask each still-training member's watch whether to stop it here (its validation predictions made once for
        all members, when the first watch asks)."""
        predictions: list[torch.Tensor] = []

        def member(i: int) -> torch.Tensor:
            if not predictions:
                predictions.append(self._predict(self.data.vx))
            return predictions[0][i, : int(self.data.n_val[i])]

        for i, watch in enumerate(self.watches):
            if watch is None or status[i] != "completed" or not bool(self.active[i]):
                continue
            reason = watch(epoch, lambda i=i: member(i))
            if reason:
                status[i] = "pruned"
                self.events[i].append(f"pruned at epoch {epoch}: {reason}; masked, the rest of the pack went on")
                self.active[i] = False

    @torch.no_grad()
    def _predict(self, vx: torch.Tensor) -> torch.Tensor:
        """Every member's predictions of its validation windows (K, N_max, ...), float32."""
        self.fused.eval()
        chunks = []
        for start in range(0, vx.shape[1], 1024):
            with self.precision.autocast():
                chunks.append(self.forward(vx[:, start : start + 1024]).float())
        return torch.cat(chunks, dim=1)

    @torch.no_grad()
    def _validate(self, vx, vy, n_val) -> list[float]:
        self.fused.eval()
        rows_total = torch.zeros(self.k, device=self.device)
        positions_all = torch.arange(vx.shape[1], device=self.device)
        chunk = 1024
        for start in range(0, vx.shape[1], chunk):
            with self.precision.autocast():
                prediction = self.forward(vx[:, start : start + chunk])
            per_sample = per_sample_regression(self.cfg.loss, prediction.float(), vy[:, start : start + chunk].float())
            valid = positions_all[start : start + chunk].unsqueeze(0) < n_val.unsqueeze(1)
            rows_total += (per_sample * valid).sum(dim=1)
        return (rows_total / n_val.clamp(min=1)).tolist()

    def _early_stop(self, i: int, val: float, epoch: int) -> bool:
        if val < self.best_val[i] - self.cfg.min_delta:
            self.best_val[i], self.best_epoch[i], self.bad[i] = val, epoch, 0
            return False
        self.bad[i] += 1
        return self.cfg.patience is not None and self.bad[i] >= self.cfg.patience

    def _keep_best(self, val_loss: list[float] | None, was_active: list[bool]) -> None:
        if val_loss is None:
            return
        improved = torch.tensor([was_active[i] and self.best_epoch[i] is not None and self.bad[i] == 0 for i in range(self.k)], device=self.device)
        self._copy_where(improved, source=self.fused.state_dict(), target=self.best_state)

    @staticmethod
    @torch.no_grad()
    def _copy_where(mask: torch.Tensor, *, source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
        for name, tensor in target.items():
            view = (-1,) + (1,) * (tensor.dim() - 1)
            tensor.copy_(torch.where(mask.view(view), source[name], tensor))
