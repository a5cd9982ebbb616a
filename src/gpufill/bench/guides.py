"""The guides' starting point, written once: how they feed data and how every loop is scored.

`gpufill bench` calls it "before" and the doctor profiles a forecaster through it: a
per-sample Dataset (each item's leaves converted with `torch.tensor`, as tutorials write
it) in `DataLoader(batch_size, shuffle=True, num_workers=0)`. A user's own Dataset,
DataLoader or IterableDataset is fed as given. `validation_loss` is the one quality
yardstick: the training's loss over the validation data, fp32, sample-weighted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from gpufill.engine import losses
from gpufill.engine.batches import rows, sample_count, to_device
from gpufill.engine.inputs import Data, as_source

VALIDATION_CHUNK = 1024
"""Samples per validation forward when the data are tensors."""


class SampleDataset(Dataset):
    """Tensors of any structure served one sample at a time, each leaf converted from numpy per item."""

    def __init__(self, data: Any):
        leaves, self.spec = pytree.tree_flatten(data)
        self.arrays = [leaf.numpy() if isinstance(leaf, torch.Tensor) else np.asarray(leaf) for leaf in leaves]

    def __len__(self) -> int:
        return self.arrays[0].shape[0]

    def __getitem__(self, index: int) -> Any:
        return pytree.tree_unflatten([torch.tensor(array[index]) for array in self.arrays], self.spec)


class WindowDataset(SampleDataset):
    """A forecaster's (inputs, targets) windows, served the guides' way."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        super().__init__((inputs, targets))


def guides_loader(data: Data, batch_size: int) -> DataLoader:
    """The data as the guides feed it (see the module docstring); a DataLoader is used as given."""
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, IterableDataset):
        return DataLoader(data, batch_size=batch_size, num_workers=0)
    if isinstance(data, Dataset):
        return DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=0)
    return DataLoader(SampleDataset(data), batch_size=batch_size, shuffle=True, num_workers=0)


def count_samples(data: Data) -> int | None:
    """Samples in one pass (None: an IterableDataset, known only after a pass)."""
    return as_source(data, "train").n


class _Head(IterableDataset):
    def __init__(self, dataset: IterableDataset, n: int):
        self.dataset, self.n = dataset, n

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.dataset), self.n)


def head(data: Data, n: int) -> Data:
    """The first `n` samples of `data`, in its own form (the untimed warm-up runs on these)."""
    if isinstance(data, DataLoader):
        dataset = data.dataset
        part = _Head(dataset, n) if isinstance(dataset, IterableDataset) else Subset(dataset, range(min(n, len(dataset))))  # type: ignore[arg-type]
        return DataLoader(part, batch_size=data.batch_size, collate_fn=data.collate_fn)
    if isinstance(data, IterableDataset):
        return _Head(data, n)
    if isinstance(data, Dataset):
        return Subset(data, range(min(n, len(data))))  # type: ignore[arg-type]
    return rows(data, 0, min(n, sample_count(data, "train")))


@torch.no_grad()
def validation_loss(model: nn.Module, val: Data, loss: Any = "mse") -> float:
    """The training's loss on `val` for the final model: eval mode, fp32, the sample-weighted mean over batches."""
    loss_fn, _ = losses.resolve(loss)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    if isinstance(val, DataLoader):
        batches: Any = val
    elif isinstance(val, Dataset):
        batches = DataLoader(val, batch_size=VALIDATION_CHUNK, num_workers=0)
    else:
        n = sample_count(val, "val")
        batches = (rows(val, start, start + VALIDATION_CHUNK) for start in range(0, n, VALIDATION_CHUNK))
    total, count = 0.0, 0
    for batch in batches:
        size = sample_count(batch, "val")
        total += float(loss_fn(model, to_device(batch, device, float_dtype=torch.float32))["loss"]) * size
        count += size
    model.train(was_training)
    return total / max(count, 1)
