"""A fused pack's learning-rate schedule: each member warms up and decays over its own optimizer steps.

`fit` alone multiplies its lr by the schedule's `Multiplier` of its step (torch's LambdaLR: after each step, the
factor of the next). A pack's members differ in their windows, so in their steps per epoch and in their schedule's
length; each row keeps its own count of steps taken, and every row's factor is computed at once on the device after
each step: no read in the hot loop, and a captured step replays it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpufill.engine.choice import Choice
from gpufill.engine.config import FitConfig
from gpufill.engine.optim import Multiplier, schedule_multiplier
from gpufill.engine.prepare import total_steps


@dataclass(frozen=True, slots=True)
class PackSchedule:
    """Row i's lr factor after `taken[i]` steps: linear warm-up over `warmup[i]` steps, then cosine or linear decay to
    `min_ratio` at step `total[i]` (engine/optim.py's Multiplier, row by row)."""

    kind: str
    min_ratio: float
    warmup: torch.Tensor
    total: torch.Tensor
    taken: torch.Tensor
    """(K,) float64 each: the rows' warm-up and length in steps, and the steps each row has taken."""

    @classmethod
    def of(cls, config: FitConfig, steps_per_epoch: Sequence[int], device: torch.device) -> tuple[PackSchedule | None, Choice[str]]:
        """The schedule of members whose epochs take `steps_per_epoch` steps (None: a constant lr) and the plan's
        record of it. Each member's length is the one `fit` alone would give it (its epochs' steps, or max_steps).
        A schedule given as a function is not for packs (fit_pack refuses it first)."""
        built = [schedule_multiplier(config, total_steps(per_epoch, config)) for per_epoch in steps_per_epoch]
        multipliers = [multiplier for multiplier, _ in built]
        if multipliers[0] is None:
            return None, built[0][1]
        assert all(isinstance(m, Multiplier) for m in multipliers)
        lengths = sorted({m.total for m in multipliers})
        choice = built[0][1] if len(lengths) == 1 else Choice(
            config.schedule, f"each member over its own steps ({lengths[0]}-{lengths[-1]}), as alone; the first: {built[0][1].reason}")
        row = lambda values: torch.tensor(values, device=device, dtype=torch.float64)  # noqa: E731
        return cls(config.schedule, config.min_lr_ratio, row([m.warmup for m in multipliers]), row([m.total for m in multipliers]),
                   torch.zeros(len(multipliers), device=device, dtype=torch.float64)), choice

    def factor(self) -> torch.Tensor:
        """(K,) float64: each row's lr multiplier for its next step."""
        s = self.taken
        warm = (s + 1) / self.warmup
        progress = ((s - self.warmup) / (self.total - self.warmup).clamp(min=1)).clamp(max=1)
        shape = 0.5 * (1 + torch.cos(math.pi * progress)) if self.kind == "warmup_cosine" else 1 - progress
        return torch.where(s < self.warmup, warm, self.min_ratio + (1 - self.min_ratio) * shape)

    def advance(self, stepped: torch.Tensor) -> torch.Tensor:
        """Count a step for the rows that took one (`stepped`, (K,) bool); their factors for the next step."""
        self.taken.add_(stepped.to(torch.float64))
        return self.factor()

    def rows(self, keep: Sequence[int]) -> PackSchedule:
        """The schedule of the members `keep` alone, each where it is (a pack re-formed from its survivors)."""
        index = torch.tensor(list(keep), device=self.taken.device)
        return PackSchedule(self.kind, self.min_ratio, self.warmup[index], self.total[index], self.taken[index].clone())
