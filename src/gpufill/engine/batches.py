"""How training data reaches the step: resident tensors batched by index, or a DataLoader.

Both give, per optimizer step, an `EffectiveBatch` that splits itself into
micro-batches on demand, so an out-of-memory retry can re-split the same samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from gpufill.engine.plan import LoaderSettings

if TYPE_CHECKING:
    from gpufill.engine.distributed import Distributed

Pair = tuple[torch.Tensor, torch.Tensor]


class EffectiveBatch(Protocol):
    size: int
    """Samples this process counts in the step (0 for a DDP rank's stand-in, see ResidentBatches.epoch)."""
    loss_denominator: float
    """The step's loss is its per-sample losses summed and divided by this: size alone;
    global_size/world_size under DDP, so DDP's average over ranks is the mean over the global
    batch even when shares differ by one; inf for a stand-in (weight 0)."""

    @property
    def rows(self) -> int:
        """Samples the batch holds (a stand-in holds one it does not count)."""
        ...

    def micro_batches(self, micro: int) -> Iterator[Pair]: ...


@dataclass(frozen=True, slots=True)
class _IndexedBatch:
    """Samples of one optimizer step, as indices into resident tensors (gathered per micro-batch)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    index: torch.Tensor
    size: int
    loss_denominator: float

    @property
    def rows(self) -> int:
        return len(self.index)

    def micro_batches(self, micro: int) -> Iterator[Pair]:
        for start in range(0, len(self.index), micro):
            part = self.index[start : start + micro]
            yield self.inputs.index_select(0, part), self.targets.index_select(0, part)


@dataclass(frozen=True, slots=True)
class _HostBatch:
    """Samples of one optimizer step collated on the host; copied per micro-batch."""

    inputs: torch.Tensor
    targets: torch.Tensor
    device: torch.device
    size: int
    loss_denominator: float
    """size: DistributedSampler gives every rank equal shares, so the mean of rank means is the global mean."""

    @property
    def rows(self) -> int:
        return self.size

    def micro_batches(self, micro: int) -> Iterator[Pair]:
        # Slices are views: no host copy; non_blocking overlaps the copy with compute when pinned.
        for start in range(0, self.size, micro):
            yield (
                self.inputs[start : start + micro].to(self.device, non_blocking=True),
                self.targets[start : start + micro].to(self.device, non_blocking=True),
            )


class ResidentBatches:
    """Tensors moved to the device once; each epoch is one on-device permutation."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device, shard: Distributed | None = None):
        self.inputs = inputs.to(device)
        self.targets = targets.to(device)
        self.device = device
        self.shard = shard  # under DDP every rank draws the same permutation and keeps its share of each batch
        self.n = int(inputs.shape[0])

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        order = torch.randperm(self.n, device=self.device, generator=generator)
        for start in range(0, self.n, batch):
            size = min(batch, self.n - start)  # host arithmetic: no sync
            index = order[start : start + size]
            if self.shard is None:
                yield _IndexedBatch(self.inputs, self.targets, index, size, float(size))
                continue
            share = self.shard.shard(index)
            if len(share) == 0:
                # A last batch smaller than the world leaves this rank nothing, but DDP needs every
                # rank's backward: it runs one sample at weight 0 (adds nothing, counts nothing).
                yield _IndexedBatch(self.inputs, self.targets, index[:1], 0, math.inf)
            else:
                yield _IndexedBatch(self.inputs, self.targets, share, len(share), size / self.shard.world_size)

    def in_order(self, batch: int) -> Iterator[Pair]:
        """The samples in order (under DDP: this rank's contiguous block of them)."""
        rows = self.shard.block(self.n) if self.shard is not None else range(self.n)
        for start in range(rows.start, rows.stop, batch):
            stop = min(start + batch, rows.stop)
            yield self.inputs[start:stop], self.targets[start:stop]


class LoaderBatches:
    """A Dataset streamed through a DataLoader whose batch is the effective batch."""

    def __init__(self, dataset: Dataset, device: torch.device, settings: LoaderSettings, shard: Distributed | None = None):
        self.dataset = dataset
        self.device = device
        self.settings = settings
        self.shard = shard
        self.n = len(dataset)  # type: ignore[arg-type]
        self._loaders: dict[tuple[int, bool], DataLoader] = {}
        self._epochs = 0

    def _loader(self, batch: int, shuffle: bool, generator: torch.Generator | None) -> DataLoader:
        key = (batch, shuffle)
        if key not in self._loaders:  # reused so persistent workers stay alive across epochs
            sampler = None
            dataset = self.dataset
            if not shuffle and self.shard is not None:
                dataset = Subset(self.dataset, self.shard.block(self.n))
            if shuffle and self.shard is not None:
                # Each rank reads only its share; the global batch is the effective batch.
                seed = int(torch.randint(2**31 - 1, (1,), generator=generator)) if generator is not None else 0
                sampler = DistributedSampler(self.dataset, self.shard.world_size, self.shard.rank, shuffle=True, seed=seed)
                batch = max(1, batch // self.shard.world_size)
            self._loaders[key] = DataLoader(
                dataset,
                batch_size=batch,
                shuffle=shuffle and sampler is None,
                sampler=sampler,
                generator=generator if sampler is None else None,
                num_workers=self.settings.num_workers,
                prefetch_factor=self.settings.prefetch_factor,
                pin_memory=self.settings.pin_memory,
                persistent_workers=self.settings.persistent_workers,
            )
        return self._loaders[key]

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        loader = self._loader(batch, True, generator)
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(self._epochs)  # a new shuffle each epoch, the same on every rank
        self._epochs += 1
        for inputs, targets in loader:
            yield _HostBatch(inputs, targets, self.device, int(inputs.shape[0]), float(inputs.shape[0]))

    def in_order(self, batch: int) -> Iterator[Pair]:
        """The samples in order (under DDP: this rank's contiguous block of them)."""
        for inputs, targets in self._loader(batch, False, None):
            yield inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
