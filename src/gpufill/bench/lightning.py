"""PyTorch Lightning's Trainer on the same training, as a Lightning user would write it for speed.

The model inside a LightningModule whose `training_step` is the same loss; the data in
`DataLoader(TensorDataset(...), batch_size, shuffle=True)`; the same fused AdamW; the
Trainer with everything that is not training switched off (logger, checkpointing, progress
bar, model summary, sanity validation). Lightning is optional (the `dev` extra installs it):
`available()` says whether it can run here.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpufill.engine import losses
from gpufill.engine.batches import tensors_of
from gpufill.engine.config import DEFAULTS
from gpufill.engine.hardware import fused_optimizer_devices


def available() -> bool:
    return importlib.util.find_spec("lightning") is not None


def lightning_fit(model: nn.Module, train: Any, val: Any, *, epochs: int, loss: Any = "mse", lr: float = DEFAULTS.lr, batch_size: int = 128,
                  device: torch.device | str = "cpu", seed: int = 0) -> list[float]:
    """Train `model` in place with Lightning's Trainer on (inputs, targets) tensors; each epoch's seconds (training + validation)."""
    environ = dict(os.environ)  # Lightning sets process-wide variables (PYTORCH_NVML_BASED_CUDA_CHECK, on import): put them back after
    try:
        return _fit(model, train, val, epochs=epochs, loss=loss, lr=lr, batch_size=batch_size, device=device, seed=seed)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def _fit(model: nn.Module, train: Any, val: Any, *, epochs: int, loss: Any, lr: float, batch_size: int, device: torch.device | str,
         seed: int) -> list[float]:
    import lightning as L  # noqa: N812 - Lightning's own spelling

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)  # "GPU available: False" and friends, once per Trainer
    device = torch.device(device)
    loss_fn, _ = losses.resolve(loss)
    fused = {"fused": True} if device.type in fused_optimizer_devices() else {}
    seconds: list[float] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, _index: int) -> torch.Tensor:
            return loss_fn(self.model, tuple(batch))["loss"]

        def validation_step(self, batch: Any, _index: int) -> None:
            loss_fn(self.model, tuple(batch))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0, **fused)

    class EpochClock(L.Callback):
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.tick = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:  # after the epoch's validation
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - self.tick)

    torch.manual_seed(seed)
    train_loader = DataLoader(TensorDataset(*tensors_of(train)), batch_size=batch_size, shuffle=True)
    val_loader = DataLoader(TensorDataset(*tensors_of(val)), batch_size=1024)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=[device.index or 0] if device.type == "cuda" else 1,
                        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[EpochClock()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "consider increasing num_workers" and the like: the point is its defaults
        trainer.fit(Module(), train_loader, val_loader)
    model.to(device)
    return seconds
