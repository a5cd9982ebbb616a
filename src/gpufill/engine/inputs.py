"""What `fit` accepts, made uniform: an (inputs, targets) pair of tensors or a Dataset ->
a checked source, the facts the plan needs, one sample's shape, and the batches the loop draws."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from gpufill.engine.batches import LoaderBatches, ResidentBatches
from gpufill.engine.distributed import Distributed
from gpufill.errors import InputError
from gpufill.engine.plan import DataFacts, Plan

Data = tuple[torch.Tensor, torch.Tensor] | Dataset


def as_source(data: Data, name: str) -> tuple[torch.Tensor, torch.Tensor] | Dataset:
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0], data.tensors[1]
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        inputs, targets = data
        if inputs.shape[0] != targets.shape[0]:
            raise InputError(
                f"inputs have {inputs.shape[0]} samples but targets have {targets.shape[0]}", field=name, fix="pass tensors with the same first dimension"
            )
        if inputs.shape[0] == 0:
            raise InputError("no samples", field=name, fix="pass at least one sample")
        return inputs, targets
    if isinstance(data, Dataset):
        return data
    raise InputError(f"expected an (inputs, targets) pair of tensors or a Dataset, got {type(data).__name__}", field=name, fix="wrap the data as (x, y) tensors")


def data_facts(train: Any, val: Any) -> DataFacts:
    is_tensor = isinstance(train, tuple)
    n_train = int(train[0].shape[0]) if is_tensor else len(train)
    total = sum(t.numel() * t.element_size() for source in (train, val) if isinstance(source, tuple) for t in source)
    return DataFacts(n_train=n_train, bytes_total=total, is_tensor=is_tensor)


def as_dataset(source: Any) -> Dataset:
    return TensorDataset(*source) if isinstance(source, tuple) else source


def sample_input(source: Any) -> torch.Tensor:
    """One sample's inputs with a batch axis: the shape key of measured choices."""
    return source[0][:1] if isinstance(source, tuple) else torch.as_tensor(source[0][0]).unsqueeze(0)


def make_batches(source: Any, plan: Plan, device: torch.device, shard: Distributed | None = None) -> ResidentBatches | LoaderBatches:
    if plan.data_placement.value == "device":
        return ResidentBatches(source[0], source[1], device, shard)
    assert plan.loader.value is not None
    return LoaderBatches(as_dataset(source), device, plan.loader.value, shard)
