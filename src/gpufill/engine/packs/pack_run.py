"""A fused pack's step: K same-shape models on their own data, stepped as one on the device.

`PackRun` holds the fused module, its optimizer (per-model lr and weight decay), the members' data and a
static batch buffer (so a CUDA graph can capture the step), and trains one epoch of every member's batches,
masking past each member's own windows, a stopped member, or a non-finite loss. It also validates and predicts,
and builds the pack of its survivors (packs/rows.py decides when). No device read inside an epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpufill.engine.config import FitConfig
from gpufill.engine.losses import per_sample_regression
from gpufill.engine.packs.fused import FusedModule
from gpufill.engine.packs.optim import PackAdamW, PackSGD
from gpufill.engine.packs.pack_data import PackData, orders
from gpufill.engine.packs.pack_schedule import PackSchedule
from gpufill.engine.packs.reform import survivors_optimizer
from gpufill.engine.packs.stacked import pack_module
from gpufill.engine.plan import Plan
from gpufill.engine.precision import Precision


class PackRun:
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
        self.limit = data.n.clone()
        """(K,) the positions each model trains on this epoch: its count, or fewer where max_steps cuts the epoch."""
        self.loss_sum = torch.zeros(k, device=device)
        """The epoch's per-model sum of sample losses, added to by every step on the device."""
        self.finite = torch.ones(k, dtype=torch.bool, device=device)
        self._zero = torch.zeros((), device=device)
        self.events: list[list[str]] = [[] for _ in range(k)]
        """Each member's events (the pack's Stopping says its stops in the same lists)."""
        self.schedule: PackSchedule | None = None
        """Each member's lr schedule over its own steps (None: a constant lr)."""
        self._constant_lrs = optimizer.lr.tolist()
        self.kind: str | None = None
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
        valid = self.positions.unsqueeze(0) < self.limit.unsqueeze(1)  # (K, b): past a model's own windows (or max_steps), or padding
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
        if self.schedule is not None:  # as LambdaLR after fit's step, an overflowed one too: the next step's lr
            self.optimizer.set_lr_factor(self.schedule.advance(step_active))
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

    def epoch(self, generators: Sequence[torch.Generator], steps_left: Sequence[int] | None) -> tuple[list[float], list[bool], list[int], list[int]]:
        """One epoch of every member's batches, member j at most steps_left[j] steps (past them its windows are masked,
        as past its own count: `fit` alone cuts its epoch there); each member's mean train loss over what it trained,
        whether every step's loss was finite, its steps and the samples it trained on. One read of the device, at the end."""
        d = self.data
        taken = list(d.counts) if steps_left is None else [min(count, left * d.batch) for count, left in zip(d.counts, steps_left, strict=True)]
        if steps_left is not None:
            self.limit.copy_(torch.tensor(taken, device=self.device))
        order = orders(generators, d.counts, d.x.shape[1], self.device)
        self.loss_sum.zero_()
        self.finite.fill_(True)
        self.fused.train()
        for start in range(0, max(taken), d.batch):
            self._advance(order, start)
        loss = (self.loss_sum / self.limit.clamp(min=1)).tolist()  # the epoch's one read
        return loss, self.finite.tolist(), [-(-n // d.batch) for n in taken], taken

    def learning_rates(self) -> list[float]:
        """Each row's lr for its next step (under a schedule, a read of the device: once an epoch, at its end)."""
        return self._constant_lrs if self.schedule is None else self.optimizer.lr.tolist()

    def survivors(self, keep: Sequence[int]) -> PackRun:
        """A pack of the members `keep` (rows here) alone, each carrying on exactly where it is: its weights, optimizer
        moments and steps, data and events (the same lists)."""
        fused = pack_module([self.fused.unfuse(i) for i in keep], self.kind).to(self.device)
        optimizer = survivors_optimizer(self.cfg.optimizer, self.optimizer, list(fused.parameters()), keep)
        run = PackRun(fused, optimizer, self.precision, self.cfg, self.data.rows(keep), self.device)
        run.events, run.kind, run.plan = [self.events[i] for i in keep], self.kind, self.plan
        run.schedule = None if self.schedule is None else self.schedule.rows(keep)  # the lr itself came with the optimizer's state
        return run

    def let_go(self) -> None:
        """What a smaller pack now holds for itself, freed here (on a GPU the two packs would otherwise share its
        memory): the optimizer's moments, the data, the captured step. Weights stay: the stopped members' are kept in
        them, and the survivors' come back into them."""
        empty = torch.empty(0, device=self.device)
        for name in ("exp_avg", "exp_avg_sq", "buffer"):
            if hasattr(self.optimizer, name):
                setattr(self.optimizer, name, empty)
        self.data = PackData(x=empty, y=empty, n=empty, counts=[], batch=self.data.batch, vx=None, vy=None, n_val=None)
        self.graph = None

    @torch.no_grad()
    def predict(self) -> torch.Tensor:
        """Every member's predictions of its validation windows (K, N_max, ...), float32."""
        assert self.data.vx is not None
        self.fused.eval()
        chunks = []
        for start in range(0, self.data.vx.shape[1], 1024):
            with self.precision.autocast():
                chunks.append(self.forward(self.data.vx[:, start : start + 1024]).float())
        return torch.cat(chunks, dim=1)

    @torch.no_grad()
    def validate(self) -> list[float]:
        """Each member's mean validation loss."""
        vx, vy, n_val = self.data.vx, self.data.vy, self.data.n_val
        assert vx is not None and vy is not None and n_val is not None
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
