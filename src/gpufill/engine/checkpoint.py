"""Training checkpoints: state dicts plus JSON metadata, loaded with weights_only=True.

`last.pt` holds only tensors and plain containers (model, optimizer, precision and schedule
state dicts, RNG states, the best weights) and the metadata as a JSON string, so one atomic
write (tmp + os.replace) keeps them together; `meta.json` beside it is the same metadata for
people and tools. Loading with weights_only=True means a crafted file cannot run code.

The metadata says what the checkpoint belongs to (fingerprints of the model, the optimizer
and the training data, and the settings that change what is learned: seed, lr, ...): resuming
with another one is refused in one line, as is a damaged file or one written by an older gpufill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpufill.engine.config import FitConfig
from gpufill.engine.result import EpochRecord
from gpufill.errors import InputError
from gpufill.files import check_target, check_writable, make_folder, open_lock, write_atomically

CHECKPOINT_NAME = "last.pt"
META_NAME = "meta.json"
LOCK_NAME = ".gpufill-training.lock"
"""Held (flock) by the training writing checkpoints here."""
FORMAT = 2
"""Bumped when the layout changes; format 1 was a pickle of Python objects (weights_only=False)."""

_FIX = "point checkpoint_dir at a new directory, or delete the checkpoint to start over (resume=False ignores it)"


@dataclass(slots=True)
class TrainingState:
    """Everything besides the tensors that must survive a restart to continue exactly where training stopped."""

    epoch: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    best_val: float = math.inf
    best_epoch: int | None = None
    best_weights: dict[str, torch.Tensor] | None = None
    bad_validations: int = 0
    steps: int = 0
    """Optimizer steps done (max_steps counts from the first)."""


LEARNING = ("seed", "lr", "weight_decay", "batch_size", "reference_batch", "lr_scale_rule", "optimizer", "schedule", "warmup_steps",
            "min_lr_ratio", "loss", "grad_clip")
"""The settings a resume must share with its checkpoint: each changes what the weights become (a resume at another lr
or seed would continue silently at the checkpoint's). Not epochs, max_steps or patience: resuming to train longer is what
a checkpoint is for. A function (a loss, schedule or optimizer factory) cannot be compared across processes: left out."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What a checkpoint belongs to; a resume must match all of it."""

    model: str
    optimizer: str
    data: str
    settings: dict[str, Any] = field(default_factory=dict)
    """The LEARNING settings that are plain values (`learning_settings`)."""

    def mismatch(self, saved: dict[str, Any]) -> str | None:
        for what in ("model", "optimizer", "data"):
            if saved.get(what) != getattr(self, what):
                return what
        return None

    def setting_mismatch(self, saved: dict[str, Any]) -> tuple[str, Any, Any] | None:
        """(name, the checkpoint's value, this training's) of the first setting that differs; None when all agree.
        A checkpoint written before settings were kept has none to compare."""
        kept = saved.get("settings") or {}
        return next(((name, kept[name], value) for name, value in self.settings.items() if name in kept and kept[name] != value), None)


def learning_settings(cfg: FitConfig) -> dict[str, Any]:
    """cfg's LEARNING settings that are plain values (JSON: they are compared after a round trip through meta.json)."""
    return {name: value for name in LEARNING if isinstance(value := getattr(cfg, name), str | int | float | None)}


def model_fingerprint(model: nn.Module) -> str:
    """The model's class and every parameter's and buffer's name, shape and dtype."""
    entries = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in model.state_dict().items())
    return hashlib.sha1(f"{type(model).__qualname__}|{entries}".encode()).hexdigest()[:16]


def optimizer_fingerprint(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's class and its parameter groups' shapes."""
    groups = "|".join(",".join(str(tuple(p.shape)) for p in group["params"]) for group in optimizer.param_groups)
    return hashlib.sha1(f"{type(optimizer).__qualname__}|{groups}".encode()).hexdigest()[:16]


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CHECKPOINT_NAME


def save_checkpoint(directory: str | os.PathLike[str], tensors: dict[str, Any], meta: dict[str, Any]) -> Path:
    """One atomic write of last.pt (a new temporary file, then a rename), then meta.json: a link at either name is
    refused, and a full disk is one line that says the checkpoint before it is kept as it was."""
    path = checkpoint_path(directory)
    text = json.dumps(meta, indent=1, default=str)
    try:
        write_atomically(path, lambda handle: _save({**tensors, "meta_json": text}, handle), field="checkpoint_dir")
        write_atomically(path.parent / META_NAME, text + "\n", field="checkpoint_dir")
    except InputError as error:
        epoch = meta.get("state", {}).get("epoch")
        raise InputError(f"{error.problem}: the checkpoint after epoch {epoch} was not written; the one before it is kept as it was",
                         where=error.where, field=error.field, fix=f"{error.fix}, then resume (resume=True, or --resume)") from None
    return path


def _save(payload: dict[str, Any], handle: Any) -> None:
    """torch.save into an open file; the OSError of a failed write (a full disk) is raised as itself (torch's zip
    writer meets it, then fails again closing the archive, and raises a RuntimeError instead)."""
    try:
        torch.save(payload, handle)
    except RuntimeError as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise cause from None


@contextlib.contextmanager
def held_directory(directory: str | os.PathLike[str] | None) -> Iterator[None]:
    """For a whole training: checkpoint_dir is created and checked writable now (a read-only folder is one line
    before the first epoch, not after it), and no other training writes checkpoints there meanwhile (an flock on
    LOCK_NAME, which the kernel releases however this process ends). Under torchrun rank 0 alone writes."""
    if directory is None or os.environ.get("RANK", "0") not in ("", "0"):
        yield
        return
    folder = make_folder(directory, field="checkpoint_dir")
    descriptor = open_lock(folder / LOCK_NAME, field="checkpoint_dir")
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "?"
        os.close(descriptor)
        raise InputError(f"another training (pid {holder}) is writing its checkpoints here; two trainings in one folder would overwrite "
                         "each other's", where=str(folder), field="checkpoint_dir",
                         fix="give each training its own checkpoint_dir, or wait for the other one to finish") from None
    try:
        for name in (CHECKPOINT_NAME, META_NAME):  # a link there: refused now, not when the first epoch ends
            check_target(folder / name, field="checkpoint_dir")
        check_writable(folder, field="checkpoint_dir")
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
        yield
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def load_checkpoint(directory: str | os.PathLike[str], device: torch.device) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(tensors, metadata) of the last checkpoint, None when there is none; a file that is damaged,
    unsafe or from an older gpufill is an InputError."""
    path = checkpoint_path(directory)
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises several types for truncated, garbage or unsafe files
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            reason = "it holds Python objects, not only tensors (an older gpufill, or not a gpufill checkpoint); it was not run"
        raise InputError(f"{path}: cannot load the checkpoint ({reason[:160]})", field="checkpoint_dir", fix=_FIX) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("meta_json"), str):
        raise InputError(f"{path}: not a gpufill checkpoint (no metadata)", field="checkpoint_dir", fix=_FIX)
    try:
        meta = json.loads(payload.pop("meta_json"))
    except json.JSONDecodeError:
        raise InputError(f"{path}: the checkpoint's metadata is damaged", field="checkpoint_dir", fix=_FIX) from None
    if meta.get("format") != FORMAT:
        raise InputError(f"{path}: checkpoint format {meta.get('format')!r}, this gpufill reads format {FORMAT}", field="checkpoint_dir", fix=_FIX)
    return payload, meta


def check_identity(meta: dict[str, Any], identity: Identity, directory: str | os.PathLike[str]) -> None:
    saved = meta.get("identity", {})
    what = identity.mismatch(saved)
    if what is not None:
        other = {"model": "another model (different class or parameter shapes)", "optimizer": "another optimizer or parameter groups",
                 "data": "other training data (different samples, structure or size)"}[what]
        raise InputError(f"{checkpoint_path(directory)} was written for {other}; resuming would mix two trainings", field="resume",
                         fix=f"resume with the same {what}, or {_FIX}")
    differs = identity.setting_mismatch(saved)
    if differs is not None:
        name, kept, value = differs
        raise InputError(f"{checkpoint_path(directory)} was written with {name}={kept!r}, this training has {name}={value!r}; resuming "
                         "would continue the other training's weights under this one's settings", field=name,
                         fix=f"resume with {name}={kept!r}, or {_FIX}")


def state_meta(state: TrainingState) -> dict[str, Any]:
    return {
        "epoch": state.epoch,
        "history": [dataclasses.asdict(record) for record in state.history],
        "best_val": state.best_val if math.isfinite(state.best_val) else None,
        "best_epoch": state.best_epoch,
        "bad_validations": state.bad_validations,
        "steps": state.steps,
    }


def state_from(meta: dict[str, Any], best_weights: dict[str, torch.Tensor] | None) -> TrainingState:
    return TrainingState(
        epoch=int(meta["epoch"]),
        history=[EpochRecord(**record) for record in meta["history"]],
        best_val=math.inf if meta["best_val"] is None else float(meta["best_val"]),
        best_epoch=meta["best_epoch"],
        best_weights=best_weights,
        bad_validations=int(meta["bad_validations"]),
        steps=int(meta.get("steps", 0)),  # checkpoints written before max_steps existed
    )


def rng_state(generator: torch.Generator, device: torch.device) -> dict[str, torch.Tensor]:
    state = {"generator": generator.get_state(), "torch_rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(saved: dict[str, Any], generator: torch.Generator, device: torch.device) -> None:
    generator.set_state(saved["generator"].cpu())  # generator states live on the host
    torch.set_rng_state(saved["torch_rng"].cpu())
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"].cpu(), device)


def resume(directory: str | os.PathLike[str], identity: Identity, model: nn.Module, device: torch.device,
           events: list[str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The last checkpoint in `directory` (tensors, metadata), checked to belong to this training (`identity`);
    the model's weights are loaded now. None, said in `events`, where there is none yet."""
    loaded = load_checkpoint(directory, device)
    if loaded is None:
        events.append("resume: no checkpoint yet, starting from epoch 1")
        return None
    saved, meta = loaded
    check_identity(meta, identity, directory)
    model.load_state_dict(saved["model"])
    return loaded
