"""How training data reaches the step, whatever its structure.

A batch is whatever the data yields: a tensor, a tuple of any length, a dict, or a nested
mix (walked with torch's pytree). Its sample count is the tensor leaves' shared first
dimension. Sources give, per optimizer step, an `EffectiveBatch` that splits itself into
micro-batches on demand, so an out-of-memory retry can re-split the same samples:

- `ResidentBatches`: tensors moved to the device once, batched by an on-device permutation
  and gathered leaf by leaf;
- `DatasetBatches`: a map-style Dataset through a DataLoader built from the plan's settings;
- `GivenLoaderBatches`: the user's own DataLoader, used as given (several of its batches
  make one optimizer step when the effective batch asks for accumulation);
- `StreamBatches`: an IterableDataset through a DataLoader; an epoch is one pass, or
  `steps_per_epoch` steps when given.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Subset

from gpufill.engine.batching import LoaderSettings
from gpufill.errors import InputError

if TYPE_CHECKING:
    from gpufill.engine.distributed import Distributed

Batch = Any
"""A tensor, or tuples / lists / dicts of them, nested."""


# -- batch structure -------------------------------------------------------------------------


def tensors_of(batch: Batch) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(batch) if isinstance(leaf, torch.Tensor)]


def sample_count(batch: Batch, where: str = "batch") -> int:
    """The tensor leaves' shared first dimension; a mismatch is one line."""
    sizes = {int(t.shape[0]) if t.dim() else -1 for t in tensors_of(batch)}
    if -1 in sizes:
        raise InputError(f"the {where} holds a 0-dimensional tensor: every tensor needs a first (sample) dimension", field=where,
                         fix="give scalars a sample dimension (e.g. y.unsqueeze(0) per sample, or a tensor of shape (n,))")
    if len(sizes) != 1:
        raise InputError(f"the {where}'s tensors disagree on the number of samples: first dimensions {sorted(sizes)}" if sizes
                         else f"the {where} holds no tensor", field=where,
                         fix="give every tensor of a batch the same first dimension (one row per sample)")
    return sizes.pop()


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Batch) -> Batch:
    return pytree.tree_map(lambda leaf: fn(leaf) if isinstance(leaf, torch.Tensor) else leaf, batch)


def to_device(batch: Batch, device: torch.device, *, float_dtype: torch.dtype | None = None) -> Batch:
    """Each tensor leaf to `device` (non_blocking: overlaps compute when the host memory is pinned);
    float64 leaves become `float_dtype` when given (the model's floats)."""

    def move(leaf: torch.Tensor) -> torch.Tensor:
        if float_dtype is not None and leaf.dtype == torch.float64:
            return leaf.to(device, dtype=float_dtype, non_blocking=True)
        return leaf.to(device, non_blocking=True)

    return map_tensors(move, batch)


def take(batch: Batch, index: torch.Tensor) -> Batch:
    return map_tensors(lambda leaf: leaf.index_select(0, index), batch)


def rows(batch: Batch, start: int, stop: int) -> Batch:
    return map_tensors(lambda leaf: leaf[start:stop], batch)


def concat(batches: Sequence[Batch]) -> Batch:
    """Batches of one structure joined along the sample dimension, leaf by leaf."""
    flat, spec = zip(*(pytree.tree_flatten(b) for b in batches), strict=True)
    joined = [torch.cat(leaves) if isinstance(leaves[0], torch.Tensor) else leaves[0] for leaves in zip(*flat, strict=True)]
    return pytree.tree_unflatten(joined, spec[0])


def signature(batch: Batch) -> str:
    """Structure, per-sample shapes and dtypes: what makes two batches interchangeable for a measurement."""
    leaves, spec = pytree.tree_flatten(batch)
    shapes = ",".join(f"{tuple(t.shape[1:])}{str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor) else type(t).__name__
                      for t in leaves)
    kinds = str(spec).replace(" ", "")
    return f"{shapes}|{kinds[:200]}"


# -- one optimizer step's samples ----------------------------------------------------------


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

    def micro_batches(self, micro: int) -> Iterator[tuple[Batch, int]]:
        """(micro-batch on the device, its sample count)."""
        ...


class _Resident:
    """Resident tensors flattened once, so gathering a batch costs one index_select per leaf and
    no walk of the structure (a plain tuple, the usual case, is rebuilt as a tuple)."""

    def __init__(self, data: Batch):
        self.leaves, self.spec = pytree.tree_flatten(data)
        if not all(isinstance(leaf, torch.Tensor) for leaf in self.leaves):
            kinds = sorted({type(leaf).__name__ for leaf in self.leaves if not isinstance(leaf, torch.Tensor)})
            raise InputError(f"resident data holds {', '.join(kinds)} values, not only tensors", field="train",
                             fix="pass tensors (or numpy arrays) only, or wrap the data in a Dataset")
        self.plain_tuple = isinstance(data, tuple) and type(data) is tuple and all(isinstance(x, torch.Tensor) for x in data)

    def gather(self, index: torch.Tensor) -> Batch:
        picked = [leaf.index_select(0, index) for leaf in self.leaves]
        return tuple(picked) if self.plain_tuple else pytree.tree_unflatten(picked, self.spec)

    def slice(self, start: int, stop: int) -> Batch:
        picked = [leaf[start:stop] for leaf in self.leaves]
        return tuple(picked) if self.plain_tuple else pytree.tree_unflatten(picked, self.spec)


@dataclass(frozen=True, slots=True)
class _IndexedBatch:
    """Samples of one optimizer step, as indices into resident tensors (gathered per micro-batch)."""

    data: _Resident
    index: torch.Tensor
    size: int
    loss_denominator: float
    rows: int
    """len(index), known on the host (a tensor's len() costs a call per step)."""

    def micro_batches(self, micro: int) -> Iterator[tuple[Batch, int]]:
        if self.rows <= micro:  # the usual case: the whole batch at once
            yield self.data.gather(self.index), self.rows
            return
        for start in range(0, len(self.index), micro):
            part = self.index[start : start + micro]
            yield self.data.gather(part), len(part)


@dataclass(frozen=True, slots=True)
class _HostBatch:
    """Samples of one optimizer step as host batches (one, or several of a user's loader);
    copied to the device per micro-batch."""

    parts: tuple[tuple[Batch, int], ...]
    """(host batch, its sample count)"""
    device: torch.device
    size: int
    loss_denominator: float
    float_dtype: torch.dtype | None

    @property
    def rows(self) -> int:
        return self.size

    def micro_batches(self, micro: int) -> Iterator[tuple[Batch, int]]:
        for batch, count in self.parts:
            if count <= micro:
                yield to_device(batch, self.device, float_dtype=self.float_dtype), count
                continue
            # Slices are views: no host copy.
            for start in range(0, count, micro):
                stop = min(start + micro, count)
                yield to_device(rows(batch, start, stop), self.device, float_dtype=self.float_dtype), stop - start


def _host_step(parts: Sequence[Batch], device: torch.device, float_dtype: torch.dtype | None, where: str) -> _HostBatch:
    counted = tuple((part, sample_count(part, where)) for part in parts)
    size = sum(count for _, count in counted)
    return _HostBatch(counted, device, size, float(size), float_dtype)


# -- sources ---------------------------------------------------------------------------------


class Batches(Protocol):
    n: int | None
    """Samples per epoch (None: not known before the first epoch ends)."""

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]: ...

    def in_order(self, batch: int) -> Iterator[tuple[Batch, int]]:
        """The samples in order, for validation (under DDP: this rank's share)."""
        ...


class ResidentBatches:
    """Tensors moved to the device once; each epoch is one on-device permutation."""

    def __init__(self, data: Batch, device: torch.device, shard: Distributed | None = None):
        self.n = sample_count(data)
        self.data = _Resident(map_tensors(lambda leaf: leaf.to(device), data))
        self.device = device
        self.shard = shard  # under DDP every rank draws the same permutation and keeps its share of each batch

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        order = torch.randperm(self.n, device=self.device, generator=generator)
        for start in range(0, self.n, batch):
            size = min(batch, self.n - start)  # host arithmetic: no sync
            index = order[start : start + size]
            if self.shard is None:
                yield _IndexedBatch(self.data, index, size, float(size), size)
                continue
            share = self.shard.shard(index)
            if len(share) == 0:
                # A last batch smaller than the world leaves this rank nothing, but DDP needs every
                # rank's backward: it runs one sample at weight 0 (adds nothing, counts nothing).
                yield _IndexedBatch(self.data, index[:1], 0, math.inf, 1)
            else:
                yield _IndexedBatch(self.data, share, len(share), size / self.shard.world_size, len(share))

    def in_order(self, batch: int) -> Iterator[tuple[Batch, int]]:
        block = self.shard.block(self.n) if self.shard is not None else range(self.n)
        for start in range(block.start, block.stop, batch):
            stop = min(start + batch, block.stop)
            yield self.data.slice(start, stop), stop - start


class DatasetBatches:
    """A map-style Dataset streamed through a DataLoader whose batch is the effective batch."""

    def __init__(self, dataset: Dataset, device: torch.device, settings: LoaderSettings, shard: Distributed | None = None,
                 float_dtype: torch.dtype | None = None):
        self.dataset, self.device, self.settings, self.shard, self.float_dtype = dataset, device, settings, shard, float_dtype
        self.n: int | None = len(dataset)  # type: ignore[arg-type]
        self._loaders: dict[tuple[int, bool], DataLoader] = {}
        self._epochs = 0
        self._host_generator = torch.Generator()
        """A DataLoader shuffles on the host: this one is re-seeded each epoch from the training's
        generator (which may live on the GPU), so the order still follows the seed and a resumed run."""

    def _loader(self, batch: int, shuffle: bool, generator: torch.Generator | None) -> DataLoader:
        key = (batch, shuffle)
        if key not in self._loaders:  # reused so persistent workers stay alive across epochs
            sampler = None
            dataset = self.dataset
            assert self.n is not None
            if not shuffle and self.shard is not None:
                dataset = Subset(self.dataset, self.shard.block(self.n))
            if shuffle and self.shard is not None:
                # Each rank reads only its share; the global batch is the effective batch.
                seed = int(torch.randint(2**31 - 1, (1,), generator=generator)) if generator is not None else 0  # host generator
                sampler = DistributedSampler(self.dataset, self.shard.world_size, self.shard.rank, shuffle=True, seed=seed)
                batch = max(1, batch // self.shard.world_size)
            self._loaders[key] = DataLoader(
                dataset,
                batch_size=batch,
                shuffle=shuffle and sampler is None,
                sampler=sampler,
                generator=self._host_generator if shuffle and sampler is None else None,
                num_workers=self.settings.num_workers,
                prefetch_factor=self.settings.prefetch_factor,
                pin_memory=self.settings.pin_memory,
                persistent_workers=self.settings.persistent_workers,
            )
        return self._loaders[key]

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        draw = torch.randint(2**62, (1,), device=generator.device, generator=generator)
        self._host_generator.manual_seed(int(draw))  # one tiny copy per epoch, not per step
        loader = self._loader(batch, True, self._host_generator)
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(self._epochs)  # a new shuffle each epoch, the same on every rank
        self._epochs += 1
        for host in loader:
            yield _host_step((host,), self.device, self.float_dtype, "train")

    def in_order(self, batch: int) -> Iterator[tuple[Batch, int]]:
        for host in self._loader(batch, False, None):
            yield to_device(host, self.device, float_dtype=self.float_dtype), sample_count(host, "val")


class GivenLoaderBatches:
    """The user's DataLoader, as given: `group` of its batches make one optimizer step."""

    def __init__(self, loader: DataLoader, device: torch.device, loader_batch: int, float_dtype: torch.dtype | None = None):
        self.loader, self.device, self.loader_batch, self.float_dtype = loader, device, loader_batch, float_dtype
        dataset = loader.dataset
        self.n: int | None = len(dataset) if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__") else None  # type: ignore[arg-type]

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        group = max(1, batch // self.loader_batch)
        batches = iter(self.loader)
        while chunk := list(itertools.islice(batches, group)):
            yield _host_step(chunk, self.device, self.float_dtype, "train")

    def in_order(self, batch: int) -> Iterator[tuple[Batch, int]]:
        for host in self.loader:
            yield to_device(host, self.device, float_dtype=self.float_dtype), sample_count(host, "val")


class StreamBatches:
    """An IterableDataset through a DataLoader; an epoch is one pass, or `steps` steps of a
    stream that goes on across epochs."""

    def __init__(self, dataset: IterableDataset, device: torch.device, settings: LoaderSettings, steps: int | None,
                 float_dtype: torch.dtype | None = None):
        self.dataset, self.device, self.settings, self.steps, self.float_dtype = dataset, device, settings, steps, float_dtype
        self.n: int | None = None
        self._loader: DataLoader | None = None
        self._iterator: Iterator[Batch] | None = None

    def _make(self, batch: int) -> DataLoader:
        return DataLoader(self.dataset, batch_size=batch, num_workers=self.settings.num_workers, prefetch_factor=self.settings.prefetch_factor,
                          pin_memory=self.settings.pin_memory, persistent_workers=self.settings.persistent_workers)

    def epoch(self, batch: int, generator: torch.Generator) -> Iterator[EffectiveBatch]:
        if self._loader is None or self._loader.batch_size != batch:
            self._loader, self._iterator = self._make(batch), None
        if self.steps is None:  # one pass
            for host in self._loader:
                yield _host_step((host,), self.device, self.float_dtype, "train")
            return
        for _ in range(self.steps):  # a fixed number of steps from a stream that continues across epochs
            host = next(self._iterator, None) if self._iterator is not None else None
            if host is None:
                self._iterator = iter(self._loader)
                host = next(self._iterator, None)
                if host is None:
                    raise InputError("the IterableDataset yields no samples", field="train", fix="check the dataset's __iter__")
            yield _host_step((host,), self.device, self.float_dtype, "train")

    def in_order(self, batch: int) -> Iterator[tuple[Batch, int]]:
        for host in self._make(batch):
            yield to_device(host, self.device, float_dtype=self.float_dtype), sample_count(host, "val")

