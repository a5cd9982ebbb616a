"""What `fit` accepts, made uniform: tensors in any structure, a map-style Dataset, a user's
DataLoader or an IterableDataset -> a checked `Source` with one sample batch, the facts
the plan needs, and the batches the loop draws.

Tensors (a tensor, a tuple of any length, a dict, nested; numpy arrays are taken as
tensors) can be made resident; their sample count is the leaves' shared first dimension.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, default_collate

from gpufill.engine.batches import (
    Batch,
    DatasetBatches,
    GivenLoaderBatches,
    ResidentBatches,
    StreamBatches,
    rows,
    sample_count,
    signature,
    tensors_of,
)
from gpufill.engine.batching import DataFacts, LoaderSettings
from gpufill.engine.distributed import Distributed
from gpufill.engine.plan import Plan
from gpufill.errors import InputError, describe

Kind = Literal["tensors", "dataset", "loader", "stream"]
Data = Any
"""Tensors (any structure), a Dataset, a DataLoader or an IterableDataset."""


@dataclass(slots=True)
class Source:
    """One data argument of fit (train or val), checked."""

    name: str
    kind: Kind
    data: Any
    """The tensor structure, Dataset, DataLoader or IterableDataset."""
    n: int | None
    """Samples (None: unknown before a pass)."""
    sample: Batch
    """One batch with a batch axis (tensors: the first row; a loader: its first batch)."""
    nbytes: int = 0
    notes: list[str] = field(default_factory=list)


def as_source(data: Data, name: str) -> Source:
    """Classify and check `data`; a bad structure is one InputError naming `name`."""
    if isinstance(data, DataLoader):
        first = _first(data, name)
        return Source(name, "loader", data, _length(data.dataset), first)
    if isinstance(data, IterableDataset):
        first = _first(DataLoader(data, batch_size=2), name)
        return Source(name, "stream", data, None, rows(first, 0, 1))
    if isinstance(data, TensorDataset):
        data = data.tensors
    if isinstance(data, Dataset):
        n = _length(data)
        if not n:
            raise InputError("the Dataset is empty" if n == 0 else "the Dataset has no __len__", field=name,
                             fix="pass a map-style Dataset with samples (or an IterableDataset)")
        return Source(name, "dataset", data, n, default_collate([_same_structure(data, n, name)]))
    return _tensor_source(data, name)


def check_model(model: Any, field: str = "model") -> None:
    """A module fit can train: every parameter and buffer holds values (a meta-device model has shapes only)."""
    for what, tensors in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for tensor_name, tensor in tensors:
            if tensor.is_meta:
                raise InputError(f"the model's {what} {tensor_name!r} is on the meta device (a shape with no values)", field=field,
                                 fix="build the model on a real device, or materialise it first: model.to_empty(device='cpu'), "
                                     "then initialise or load its weights (e.g. model.load_state_dict(...))")


def _as_tensor(array: np.ndarray, name: str) -> torch.Tensor:
    """A numpy array as a tensor; an array of Python objects, strings, bytes or dates is one line naming how to convert it."""
    if array.dtype.kind in "biufc":  # a reversed view (x[::-1]) has negative strides, which torch cannot share: copied
        return torch.from_numpy(np.ascontiguousarray(array) if any(stride < 0 for stride in array.strides) else array)
    what = {"O": "Python objects", "U": "strings", "S": "bytes", "M": "datetimes", "m": "timedeltas", "V": "records"}.get(array.dtype.kind, str(array.dtype))
    raise InputError(f"a numpy array of dtype {array.dtype} ({what}) is not numbers a model can take", field=name,
                     fix="convert it to numbers first, e.g. np.asarray(x, dtype=np.float32) (labels: integer codes), or pass a Dataset")


def _tensor_source(data: Data, name: str) -> Source:
    leaves, spec = pytree.tree_flatten(data)
    if not leaves:
        raise InputError(f"{name} holds no tensors", field=name, fix="pass tensors, a Dataset or a DataLoader")
    converted = []
    for leaf in leaves:
        if isinstance(leaf, np.ndarray):
            leaf = _as_tensor(leaf, name)
        if not isinstance(leaf, torch.Tensor):
            raise InputError(
                f"expected tensors (a tuple, list or dict of them), a Dataset or a DataLoader, got {type(leaf).__name__}", field=name,
                fix="pass e.g. (inputs, targets) tensors, a dict of tensors, a torch Dataset or a DataLoader")
        if leaf.is_meta:
            raise InputError("a tensor on the meta device (a shape with no values)", field=name, fix="pass tensors that hold data (on the CPU or a GPU)")
        converted.append(leaf)
    data = pytree.tree_unflatten(converted, spec)
    n = sample_count(data, name)
    if n == 0:
        raise InputError("no samples", field=name, fix="pass at least one sample")
    return Source(name, "tensors", data, n, rows(data, 0, 1), nbytes=sum(t.numel() * t.element_size() for t in converted))


def _same_structure(dataset: Dataset, n: int, name: str) -> Any:
    """The first item, after checking that the second and last have its structure (collating
    mixed items fails deep in a worker otherwise)."""
    first = dataset[0]
    spec = pytree.tree_structure(first)
    for index in sorted({min(1, n - 1), n - 1} - {0}):
        other = pytree.tree_structure(dataset[index])
        if other != spec:
            raise InputError(f"the Dataset's items differ in structure: item 0 is {describe(first)}, item {index} is {describe(dataset[index])}",
                             field=name, fix="return the same structure (e.g. always (inputs, targets)) from every __getitem__")
    return first


def _first(loader: DataLoader, name: str) -> Batch:
    for batch in loader:
        return batch
    raise InputError("the DataLoader yields no batches", field=name, fix="pass data with at least one sample")


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def harmonise_floats(source: Source, model: nn.Module) -> torch.dtype | None:
    """float64 data for a float32 model: resident tensors are cast once, loader batches as they
    are copied; noted, not refused (numpy arrays are float64 by default). Returns the dtype
    loader copies cast float64 to (None: no cast)."""
    model_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if model_dtype is None or model_dtype == torch.float64:
        return None
    if not any(t.dtype == torch.float64 for t in tensors_of(source.sample)):
        return None
    source.notes.append(f"{source.name}: float64 tensors cast to {str(model_dtype).removeprefix('torch.')} (the model's weights' dtype)")
    if source.kind == "tensors":
        source.data = pytree.tree_map(lambda t: t.to(model_dtype) if t.dtype == torch.float64 else t, source.data)
        source.sample = pytree.tree_map(lambda t: t.to(model_dtype) if t.dtype == torch.float64 else t, source.sample)
        return None
    return model_dtype


def data_facts(train: Source, val: Source | None, steps_per_epoch: int | None) -> DataFacts:
    given = None
    loader_steps = None
    loader_batch = None
    if train.kind == "loader":
        loader: DataLoader = train.data
        loader_batch = sample_count(train.sample, "train")
        loader_steps = _length(loader)
        given = LoaderSettings(num_workers=loader.num_workers, prefetch_factor=loader.prefetch_factor, pin_memory=loader.pin_memory,
                               persistent_workers=loader.persistent_workers)
    total = train.nbytes + (val.nbytes if val is not None else 0)
    return DataFacts(n_train=train.n, bytes_total=total, kind=train.kind, loader_batch=loader_batch, given_loader=given,
                     loader_steps=loader_steps, steps_per_epoch=steps_per_epoch)


def make_batches(source: Source, plan: Plan, device: torch.device, shard: Distributed | None = None, *,
                 float_dtype: torch.dtype | None = None, steps_per_epoch: int | None = None) -> Any:
    if source.kind == "tensors" and plan.data_placement.value == "device":
        return ResidentBatches(source.data, device, shard)
    if source.kind == "loader":
        return GivenLoaderBatches(source.data, device, sample_count(source.sample), float_dtype)
    settings = plan.loader.value
    assert settings is not None
    if source.kind == "stream":
        return StreamBatches(source.data, device, settings, steps_per_epoch if source.name == "train" else None, float_dtype)
    return DatasetBatches(as_dataset(source), device, settings, shard, float_dtype)


def as_dataset(source: Source) -> Dataset:
    """A map-style Dataset of the source (tensors: one sample per row, any structure)."""
    return _TreeDataset(source.data) if source.kind == "tensors" else source.data


class _TreeDataset(Dataset):
    """Rows of a tensor structure, one sample per index (for tensors too large to keep resident)."""

    def __init__(self, data: Batch):
        self.leaves, self.spec = pytree.tree_flatten(data)
        self.n = int(self.leaves[0].shape[0])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Batch:
        return pytree.tree_unflatten([leaf[index] for leaf in self.leaves], self.spec)


def fingerprint(source: Source, data_id: str | None = None) -> str:
    """What identifies the data a checkpoint was trained on: kind, size, structure, and `data_id` where the caller
    names the data (FitConfig.data_id: the same on every machine), else for tensors the bytes of up to 256 rows
    spread over the data (cheap for any size, and it changes when they do)."""
    digest = hashlib.sha1(f"{source.kind}|{source.n}|{signature(source.sample)}".encode())
    if data_id:
        digest.update(f"|{data_id}".encode())
    elif source.kind == "tensors" and source.n:
        picks = torch.linspace(0, source.n - 1, steps=min(256, source.n)).long()
        for leaf in tensors_of(source.data):
            digest.update(leaf.index_select(0, picks.to(leaf.device)).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
