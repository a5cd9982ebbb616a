"""Training checkpoints: what survives a restart (TrainingState, weights, optimizer, scaler, RNGs),
written atomically (tmp + os.replace), so a crash never leaves half a file."""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpufill.engine.result import EpochRecord

CHECKPOINT_NAME = "last.pt"


@dataclass(slots=True)
class TrainingState:
    """Everything that must survive a restart to continue exactly where training stopped."""

    epoch: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    best_val: float = math.inf
    best_epoch: int | None = None
    best_weights: dict[str, torch.Tensor] | None = None
    bad_validations: int = 0


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CHECKPOINT_NAME


def save_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(directory: str | os.PathLike[str], device: torch.device) -> dict[str, Any] | None:
    path = checkpoint_path(directory)
    if not path.exists():
        return None
    # weights_only=False: the checkpoint holds RNG states and history, which we wrote ourselves.
    return torch.load(path, map_location=device, weights_only=False)


def capture(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, generator: torch.Generator, device: torch.device,
            state: TrainingState, micro_batch: int) -> dict[str, Any]:
    """Everything a resumed run needs to continue exactly where this one stands."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "state": copy.deepcopy(state),
        "micro_batch": micro_batch,
    }


def restore(saved: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, generator: torch.Generator,
            device: torch.device) -> tuple[TrainingState, int]:
    """Load `capture`'s dict into the live objects; (the training state, the micro-batch it ran at)."""
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    generator.set_state(saved["generator"].cpu())  # generator states live on the host
    torch.set_rng_state(saved["torch_rng"].cpu())
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"].cpu(), device)
    return saved["state"], saved["micro_batch"]
