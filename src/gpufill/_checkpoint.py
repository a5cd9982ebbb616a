"""Training checkpoints: written atomically (tmp + os.replace), so a crash never leaves half a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "last.pt"


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
