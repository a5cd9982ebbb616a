"""A pack's data on the device: every member's windows in one (K, N_max, ...) tensor, padded past its own count,
and the per-epoch orders that give each member the batches plain `fit` would draw for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, slots=True)
class PackData:
    """A pack's data on the device: (K, N_max, ...) tensors padded past each member's own count."""

    x: torch.Tensor
    y: torch.Tensor
    n: torch.Tensor
    """(K,) training windows per member."""
    counts: list[int]
    batch: int
    vx: torch.Tensor | None
    vy: torch.Tensor | None
    n_val: torch.Tensor | None

    def rows(self, keep: Sequence[int]) -> PackData:
        """The members `keep` alone (in that order), padded to the longest of them: a re-formed pack's data. Each
        keeps its own windows and count, so its batches (its own permutation, cut at its count) are unchanged."""
        index = torch.tensor(list(keep), device=self.x.device)
        counts = [self.counts[i] for i in keep]
        width = max(counts)
        vx = vy = n_val = None
        if self.vx is not None and self.vy is not None and self.n_val is not None:
            n_val = self.n_val[index]
            val_width = int(n_val.max())
            vx, vy = self.vx[index, :val_width], self.vy[index, :val_width]
        return PackData(x=self.x[index, :width], y=self.y[index, :width], n=self.n[index], counts=counts, batch=self.batch, vx=vx, vy=vy, n_val=n_val)


def padded(pairs: Sequence[Pair | None], device: torch.device) -> Pair:
    """(K, N_max, ...) tensors: each model's samples first, zeros after (masked by counts)."""
    longest = max(p[0].shape[0] for p in pairs if p is not None)
    xs, ys = [], []
    for inputs, targets in pairs:  # type: ignore[misc]
        pad = longest - inputs.shape[0]
        xs.append(torch.cat([inputs, inputs.new_zeros((pad, *inputs.shape[1:]))]))
        ys.append(torch.cat([targets, targets.new_zeros((pad, *targets.shape[1:]))]))
    return torch.stack(xs).to(device), torch.stack(ys).to(device)


def orders(generators: Sequence[torch.Generator], counts: Sequence[int], width: int, device: torch.device) -> torch.Tensor:
    """Each model's own permutation (the one plain fit draws from its seed), padded to `width`."""
    rows = []
    for generator, count in zip(generators, counts, strict=True):
        perm = torch.randperm(count, device=device, generator=generator)
        rows.append(torch.cat([perm, torch.arange(count, width, device=device)]))
    return torch.stack(rows)
