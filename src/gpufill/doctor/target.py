"""The training the doctor diagnoses, built the way users run it before gpufill.

The default is gpufill's own forecaster (an LSTM on synthetic data) fed by the guides'
loop: a per-sample :class:`~gpufill.bench.guides.WindowDataset` in
``DataLoader(batch_size, shuffle=True, num_workers=0)``. That is the "before" that
``gpufill bench`` compares against, so the verdict speaks about the same loop.
Every option is checked here, before any timing starts, so bad input fails fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gpufill.forecasting.data import Split
from gpufill.doctor.profiler import TrainingData, check_positive
from gpufill.engine import hardware
from gpufill.errors import InputError

__all__ = ["Training", "check_device", "forecaster_training"]


@dataclass(slots=True)
class Training:
    """A model, its data as the user feeds it, and a line saying what it is."""

    description: str
    model: nn.Module
    data: TrainingData
    batch_size: int
    data_bytes: int | None
    """Bytes of the whole training data as tensors (what moving it to the device would take)."""


def check_device(device: str) -> torch.device:
    """"auto" or a device this process can use, else an InputError naming --device."""
    return hardware.check_device(device, where="gpufill doctor", field="--device")


def forecaster_training(
    model: str = "lstm",
    *,
    data: str = "synthetic",
    batch_size: int = 128,
    lookback: int = 30,
    horizon: int = 1,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Training:
    """A gpufill forecaster (family or ``package.module:factory``) on one project's windows, in the guides' loader."""
    from gpufill.bench.guides import WindowDataset
    from gpufill.forecasting.task import load_windows
    from gpufill.forecasting.family_names import built_in
    from gpufill.forecasting.models import registry

    check_positive(batch_size=batch_size, lookback=lookback)
    family = registry.resolve(model)
    if family.kind != "neural":
        raise InputError(f"model {model!r} is a classical family: it trains on the CPU lane without steps to profile",
                         where="gpufill doctor", field="--model", fix=f"pick a neural family: {', '.join(built_in('neural'))}, or your own factory")
    windows = load_windows(data, project=None, lookback=lookback, horizon=horizon, split=Split())
    torch.manual_seed(seed)  # the same weights on every run of the doctor
    network = registry.build(model, n_features=windows.n_features, lookback=lookback, horizon=horizon, params=params)
    if not isinstance(network, nn.Module):
        raise InputError(f"model {model!r} built a {type(network).__name__}, not a torch.nn.Module", where="gpufill doctor",
                         field="--model", fix="point --model at a factory that returns an nn.Module")
    inputs, targets = windows.x_train, windows.y_train
    loader = DataLoader(WindowDataset(inputs, targets), batch_size=batch_size, shuffle=True, num_workers=0)
    params_count = sum(p.numel() for p in network.parameters())
    return Training(
        description=(f"{family.name} ({params_count:,} parameters) on {windows.name} from {data}: {inputs.shape[0]} windows "
                     f"x lookback {lookback}; per-sample Dataset in DataLoader(batch_size={batch_size}, shuffle=True, num_workers=0), fp32 Adam"),
        model=network,
        data=loader,
        batch_size=batch_size,
        data_bytes=int(inputs.nbytes + targets.nbytes),
    )
