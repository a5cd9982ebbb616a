"""The plan's data choices: where the data lives, how it is loaded, the effective batch, the
micro-batch and how the learning rate follows the batch.

`make_plan` calls these in a fixed order (placement, loader, effective batch, micro-batch,
lr scale); each returns a Choice with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpufill.engine.choice import Choice
from gpufill.engine.config import Auto, LrScaleRule, SpeedSettings
from gpufill.engine.hardware import Hardware, free_memory_bytes
from gpufill.errors import InputError

# The batch size the default learning rate (1e-3, Adam) is tuned for in the models here.
DEFAULT_REFERENCE_BATCH = 128
# Keep device-resident data under this share of free device memory: the rest is for
# weights, optimizer state and activations.
RESIDENT_SHARE = 0.25

DataKind = Literal["tensors", "dataset", "loader", "stream"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderSettings:
    """DataLoader settings for data that is not resident on the device."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class DataFacts:
    """What the plan needs to know about the training data."""

    n_train: int | None
    """Training samples (None: a stream whose length is found while training)."""
    bytes_total: int
    """Bytes of all tensors (train + val) if moved to the device (0 when not tensors)."""
    kind: DataKind = "tensors"
    """tensors (can be made resident), a map-style Dataset, the user's own DataLoader, or an IterableDataset stream."""
    loader_batch: int | None = None
    """The user's DataLoader: samples per loader batch (read from its first batch)."""
    given_loader: LoaderSettings | None = None
    """The user's DataLoader: its own worker settings."""
    loader_steps: int | None = None
    """The user's DataLoader: batches per epoch (len(loader)), when it has a length."""
    steps_per_epoch: int | None = None
    """Given for a stream (FitConfig.steps_per_epoch)."""

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensors"


def data_placement(hardware: Hardware, data: DataFacts, settings: SpeedSettings) -> Choice[str]:
    size = human_bytes(data.bytes_total)
    if settings.data_placement == "device" and not data.is_tensor:
        raise InputError(
            f"data_placement 'device' needs tensors, but the data is {_KIND_WORDS[data.kind]}",
            field="data_placement",
            fix="pass tensors (a tuple, dict or TensorDataset of them), or set data_placement to auto",
        )
    if settings.data_placement != "auto":
        return Choice(settings.data_placement, "requested")
    if data.kind == "dataset":
        return Choice("loader", "data is a per-sample Dataset: read through a DataLoader")
    if data.kind == "loader":
        return Choice("loader", "your DataLoader, used as given: each batch is copied to the device leaf by leaf (non_blocking)")
    if data.kind == "stream":
        return Choice("loader", "an IterableDataset: streamed through a DataLoader")
    budget = int(free_memory_bytes(hardware) * RESIDENT_SHARE)
    if data.bytes_total <= budget:
        where = "on the GPU" if hardware.is_cuda else "in memory"
        return Choice("device", f"{size} fits {where} (under {RESIDENT_SHARE:.0%} of free memory): batched by index, no DataLoader, no per-step copies")
    return Choice("loader", f"{size} exceeds {RESIDENT_SHARE:.0%} of free device memory ({human_bytes(budget)}): streamed through a DataLoader")


_KIND_WORDS = {"tensors": "tensors", "dataset": "a per-sample Dataset", "loader": "a DataLoader", "stream": "an IterableDataset"}


def loader_settings(hardware: Hardware, data: DataFacts, placement: str, requested_workers: int | Auto) -> Choice[LoaderSettings | None]:
    if placement == "device":
        return Choice(None, "not used: data is resident")
    if data.kind == "loader":
        given = data.given_loader
        return Choice(given, "yours, as given (gpufill does not rebuild a DataLoader it was handed)")
    if requested_workers != "auto":
        workers, why = int(requested_workers), f"{requested_workers} workers requested"
    elif data.kind == "stream":
        # Each worker iterates the whole IterableDataset unless it splits itself by get_worker_info().
        workers, why = 0, "no workers: an IterableDataset repeats its samples in every worker unless it splits itself; set num_workers when it does"
    elif hardware.is_cuda:
        # One worker per spare core (the main process drives the GPU), at most 8.
        workers = max(0, min(8, hardware.cpu_count - 1))
        why = f"{workers} workers: one per spare core (of {hardware.cpu_count}), up to 8"
    elif hardware.cpu_count <= 2:
        workers, why = 0, f"no workers: on {hardware.cpu_count} cores they would compete with the training for CPU"
    else:
        workers = min(4, hardware.cpu_count // 2)
        why = f"{workers} workers: half of {hardware.cpu_count} cores, the rest compute"
    pin = hardware.is_cuda
    settings = LoaderSettings(num_workers=workers, prefetch_factor=4 if workers else None, pin_memory=pin, persistent_workers=workers > 0)
    extras = []
    if pin:
        extras.append("pinned memory so non_blocking copies overlap compute")
    if workers:
        extras.append("persistent workers (no re-fork per epoch), 4 batches prefetched per worker")
    return Choice(settings, "; ".join([why, *extras]))


def loader_tuning(data: DataFacts, placement: str, requested_workers: int | Auto) -> Choice[bool]:
    if placement == "device":
        return Choice(False, "not needed: data is resident")
    if data.kind == "loader":
        return Choice(False, "off: your DataLoader is used as given")
    if data.kind == "stream":
        return Choice(False, "off: an IterableDataset decides itself how it splits across workers")
    if requested_workers != "auto":
        return Choice(False, "off: num_workers is given")
    return Choice(True, "time a few num_workers / prefetch settings on real batches and keep the fastest")


def effective_batch(data: DataFacts, settings: SpeedSettings) -> Choice[int]:
    requested = settings.batch_size
    if data.kind == "loader":
        assert data.loader_batch is not None
        loader = data.loader_batch
        if requested == "auto":
            return Choice(loader, f"your DataLoader's batch ({loader} samples)")
        if int(requested) % loader:
            raise InputError(f"batch_size {requested} is not a whole number of your DataLoader's batches of {loader}", field="batch_size",
                             fix=f"use a multiple of {loader} (e.g. {loader * max(1, round(int(requested) / loader))}), or auto")
        return Choice(int(requested), f"requested: {int(requested) // loader} of your DataLoader's batches of {loader} per optimizer step")
    if requested != "auto":
        return Choice(int(requested), "requested")
    reference = settings.reference_batch or DEFAULT_REFERENCE_BATCH
    if data.n_train is None:
        return Choice(reference, f"the reference batch the learning rate is tuned for ({reference})")
    # At least 4 optimizer steps per epoch, so tiny projects still train.
    cap = max(1, data.n_train // 4)
    if reference <= cap:
        return Choice(reference, f"the reference batch the learning rate is tuned for ({reference})")
    batch = 2 ** int(math.log2(cap)) if cap >= 1 else 1
    return Choice(batch, f"{batch}: only {data.n_train} training samples; keeps at least 4 optimizer steps per epoch")


def micro_batch(data: DataFacts, effective: int, requested: int | Auto) -> Choice[int]:
    if requested == "auto" and data.kind == "loader":
        assert data.loader_batch is not None
        return Choice(data.loader_batch, "each of your DataLoader's batches whole; an out-of-memory error halves it and doubles accumulation")
    if requested == "auto":
        return Choice(effective, "the whole effective batch per step; an out-of-memory error halves it and doubles accumulation")
    if not 1 <= int(requested) <= effective:
        raise InputError(
            f"micro-batch {requested} must be between 1 and the effective batch {effective}",
            field="micro_batch",
            fix="lower micro_batch or raise batch_size",
        )
    return Choice(int(requested), "requested")


def steps_per_epoch(data: DataFacts, effective: int) -> int | None:
    """Optimizer steps in one epoch, when known before training."""
    if data.kind == "loader" and data.loader_batch is not None and data.loader_steps is not None:
        return math.ceil(data.loader_steps / (effective // data.loader_batch))
    if data.kind == "stream":
        return data.steps_per_epoch
    if data.n_train is None:
        return None
    return max(1, math.ceil(data.n_train / effective))


def lr_scale_factor(effective: int, reference: int, rule: LrScaleRule) -> float:
    """linear: lr x (B / B_ref) (Goyal et al. 2017); sqrt: lr x sqrt(B / B_ref) (Hoffer et al. 2017)."""
    ratio = effective / reference
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def lr_reference_batch(settings: SpeedSettings) -> int:
    """The batch the user's learning rate is tuned for."""
    if settings.reference_batch:
        return settings.reference_batch
    if settings.batch_size != "auto":
        return int(settings.batch_size)
    return DEFAULT_REFERENCE_BATCH


def lr_scale_choice(effective: int, settings: SpeedSettings, data: DataFacts | None = None) -> Choice[float]:
    if data is not None and data.kind == "loader" and settings.batch_size == "auto" and settings.reference_batch is None:
        return Choice(1.0, f"your DataLoader sets the batch ({effective}): lr unchanged (set reference_batch to scale it)")
    reference = lr_reference_batch(settings)
    if effective == reference:
        return Choice(1.0, f"effective batch equals the reference batch ({reference}): lr unchanged")
    if settings.lr_scale_rule == "none":
        return Choice(1.0, f"effective batch {effective} differs from reference {reference}, but lr scaling is off")
    factor = lr_scale_factor(effective, reference, settings.lr_scale_rule)
    return Choice(factor, f"{settings.lr_scale_rule} rule: effective batch {effective} / reference {reference} -> lr x {factor:.3g}")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def micro_batch_choices(effective: int, micro: int, reason: str) -> tuple[Choice[int], Choice[int]]:
    """The micro-batch and accumulation choices for another micro-batch of the same effective batch
    (restored from a checkpoint, or halved after an out-of-memory error)."""
    accumulation = math.ceil(effective / micro)
    return Choice(micro, reason), Choice(accumulation, f"{accumulation} micro-batches of {micro} keep the effective batch {effective}")
