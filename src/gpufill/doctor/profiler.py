"""Profile a training as the user runs it: per-phase step times, batch scaling and FLOPs.

This is a profiling mode: it synchronises the device after every phase so each phase's
time is its own (a training loop never should; gpufill.fit does not). The loop is the
plain one a user writes: ``next(iterator)``, ``.to(device)`` leaf by leaf, forward + loss,
``zero_grad`` + ``backward``, ``optimizer.step()`` (Adam). Batches may have any structure
and the loss is fit's: a name or ``fn(model, batch)``. The model is deep-copied first, so
profiling never changes the caller's weights.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.flop_counter import FlopCounterMode

from gpufill.doctor.bottleneck import PhaseTimings
from gpufill.engine import losses
from gpufill.engine.backend import is_out_of_memory, synchronize
from gpufill.engine.batches import concat, sample_count, take, tensors_of, to_device
from gpufill.engine.config import DEFAULTS
from gpufill.engine.inputs import as_source
from gpufill.errors import InputError

__all__ = ["Batch", "TrainingData", "check_positive", "count_flops", "profile_training", "typical_step"]

Batch = Any
TrainingData = Any
"""Tensors of any structure, a Dataset, a DataLoader or an IterableDataset (what fit takes)."""
LossFn = Callable[[nn.Module, Batch], dict[str, torch.Tensor]]

WARMUP_STEPS = 3
"""Untimed first steps: allocation, kernel selection and Adam's state creation happen there."""
SCALING_REPS = 5
"""Timed repetitions per batch size in the scaling probe (best of; b and 2b interleaved)."""
DISTURBED_SHARE = 0.2
"""The fifth of the profiled steps with the slowest compute is dropped as disturbed by other processes."""


def profile_training(
    model: nn.Module,
    data: TrainingData,
    *,
    batch_size: int,
    steps: int = 20,
    device: torch.device | str = "cpu",
    lr: float = DEFAULTS.lr,
    loss: Any = "mse",
    matmul_n: int | None = None,
) -> PhaseTimings:
    """Time `steps` training steps of `model` on `data`, phase by phase, then probe batch scaling.

    `data` is used as the user would: a DataLoader as given, a Dataset or IterableDataset
    through ``DataLoader(batch_size, num_workers=0)`` (shuffled when it can be), or tensors of
    any structure batched on their own device by random index.
    """
    check_positive(batch_size=batch_size, steps=steps)
    loss_fn, _ = losses.resolve(loss)
    device = torch.device(device)
    model = copy.deepcopy(model).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = _endless(data, batch_size)
    laps: list[list[float]] = []
    syncs = _SyncCounter(device)
    watch = _Stopwatch(device)
    largest: Batch | None = None
    for step in range(WARMUP_STEPS + steps):
        watch.start()
        batch = next(batches)
        watch.lap()
        with syncs:
            batch = to_device(batch, device)
        watch.lap()
        with syncs:
            value = loss_fn(model, batch)["loss"]
        watch.lap()
        with syncs:
            optimizer.zero_grad()
            value.backward()
        watch.lap()
        with syncs:
            optimizer.step()
        watch.lap()
        if step < WARMUP_STEPS:
            syncs.reset()
            continue
        laps.append(watch.laps)
        if largest is None or sample_count(batch) > sample_count(largest):
            largest = batch  # a full batch for the probes (the epoch's last may be short)
    assert largest is not None
    reference = _matmul(matmul_n, device) if matmul_n and device.type == "cpu" else None
    compute_b, compute_2b, reference_s = _scaling(model, optimizer, loss_fn, largest, device, reference)
    data_s, copy_s, forward_s, backward_s, optimizer_s = typical_step(laps)
    return PhaseTimings(
        data_s=data_s,
        copy_s=copy_s,
        forward_s=forward_s,
        backward_s=backward_s,
        optimizer_s=optimizer_s,
        batch_size=sample_count(largest),
        steps=steps,
        compute_b_s=compute_b,
        compute_2b_s=compute_2b,
        flops_per_step=count_flops(model, loss_fn, largest),
        syncs_per_step=None if syncs.count is None else syncs.count / steps,
        matmul_beside_tflops=None if reference_s is None or matmul_n is None else 2 * matmul_n**3 / reference_s / 1e12,
    )


def _matmul(n: int, device: torch.device) -> Callable[[], object]:
    """One fp32 n x n matmul: the speed test's yardstick, timed again beside the compute probe."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    return lambda: torch.mm(a, b, out=out)


def typical_step(laps: list[list[float]]) -> list[float]:
    """Per-phase means over the steps left after dropping the fifth with the slowest compute.

    Steps are ranked by their copy-to-optimizer time only, so the choice is blind to the data
    wait: a loader with workers makes the loop wait on some steps only, and those waits stay
    in the mean in full. Dropping whole steps keeps the phases of one step together.
    """
    kept = sorted(laps, key=lambda lap: sum(lap[1:]))[: max(1, math.ceil(len(laps) * (1 - DISTURBED_SHARE)))]
    return [statistics.fmean(phase) for phase in zip(*kept, strict=True)]


_EXAMPLES = {"batch_size": 128, "steps": 20, "lookback": 30}


def check_positive(**values: object) -> None:
    """Each value a positive integer, else one InputError naming the command-line option."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            option = "--" + name.replace("_", "-")
            raise InputError(f"must be a positive integer, got {value!r}", where="gpufill doctor", field=option,
                             fix=f"pass e.g. {option} {_EXAMPLES.get(name, 1)}")


def _endless(data: TrainingData, batch_size: int) -> Iterator[Any]:
    """Batches forever: a new epoch (and a new iterator, as a training loop makes) when one ends."""
    epochs: Iterable[Any]
    if isinstance(data, DataLoader):
        epochs = data
    elif isinstance(data, IterableDataset):
        epochs = DataLoader(data, batch_size=batch_size, num_workers=0)
    elif isinstance(data, Dataset):
        epochs = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=0)
    else:
        epochs = _TensorBatches(as_source(data, "data").data, batch_size)  # a bad structure is one line naming data
    while True:
        empty = True
        for batch in epochs:
            empty = False
            yield batch
        if empty:
            raise InputError("the data yields no batches", where="doctor", field="data", fix="pass data with at least one sample")


class _TensorBatches:
    """Shuffled batches of tensors of any structure by index, on the tensors' own device (host tensors stay on the host)."""

    def __init__(self, data: Any, batch_size: int):
        self.data, self.n, self.batch_size = data, sample_count(data, "data"), batch_size
        self.device = tensors_of(data)[0].device

    def __iter__(self) -> Iterator[Batch]:
        order = torch.randperm(self.n, device=self.device)
        for start in range(0, self.n, self.batch_size):
            yield take(self.data, order[start : start + self.batch_size])


class _Stopwatch:
    """Lap times of one step; each lap ends with a device sync so it holds only its own phase's work."""

    def __init__(self, device: torch.device):
        self.device = device
        self.laps: list[float] = []
        self._last = 0.0

    def start(self) -> None:
        self.laps = []
        self._last = time.perf_counter()

    def lap(self) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.laps.append(now - self._last)
        self._last = now


class _SyncCounter:
    """Counts implicit host-device syncs (CUDA's sync debug mode warns on each); None elsewhere.

    Only the user's work runs inside it; the profiler's own synchronize() calls stay outside.
    """

    def __init__(self, device: torch.device):
        self.count: int | None = 0 if device.type == "cuda" else None

    def reset(self) -> None:
        if self.count is not None:
            self.count = 0

    def __enter__(self) -> Self:
        if self.count is not None:
            self._catcher = warnings.catch_warnings(record=True)
            self._caught = self._catcher.__enter__()
            warnings.simplefilter("always")
            self._previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.count is None:
            return
        torch.cuda.set_sync_debug_mode(self._previous)
        self._catcher.__exit__(*exc)
        self.count += sum(1 for warning in self._caught if "synchroniz" in str(warning.message))


def _compute_seconds(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, batch: Batch, device: torch.device) -> float:
    start = time.perf_counter()
    optimizer.zero_grad()
    loss_fn(model, batch)["loss"].backward()
    optimizer.step()
    synchronize(device)
    return time.perf_counter() - start


def _scaling(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, batch: Batch, device: torch.device,
             reference: Callable[[], object] | None = None) -> tuple[float, float | None, float | None]:
    """Best compute time at the batch and at twice it (the batch repeated), interleaved so drift hits both.

    Best of, as the speed test's matmul rate is: the two are compared, so they are measured alike. `reference` (the
    yardstick's matmul, on a CPU) is timed in the same rounds: the speed test ran seconds earlier, and on a machine
    whose load changes its best moment and the probe's were not the same moment (a loaded CI run read a compute-bound
    MLP at 28 % of a matmul rate measured before a busier minute).

    Returns (t(b), t(2b), t(reference)); t(2b) is None when twice the batch does not fit in memory, t(reference)
    without a reference.
    """
    double: Batch | None = concat([batch, batch])
    at_b: list[float] = []
    at_2b: list[float] = []
    at_reference: list[float] = []
    for rep in range(1 + SCALING_REPS):  # the first round is a warm-up for the new shapes
        if reference is not None:
            start = time.perf_counter()
            reference()
            if rep:
                at_reference.append(time.perf_counter() - start)
        seconds = _compute_seconds(model, optimizer, loss_fn, batch, device)
        if rep:
            at_b.append(seconds)
        if double is None:
            continue
        try:
            seconds = _compute_seconds(model, optimizer, loss_fn, double, device)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            double = None
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        if rep:
            at_2b.append(seconds)
    return min(at_b), (min(at_2b) if double is not None else None), (min(at_reference) if at_reference else None)


def count_flops(model: nn.Module, loss_fn: LossFn, batch: Batch) -> float | None:
    """Forward + backward FLOPs of one step (None when torch counts none, e.g. no matmul-like ops).

    cuDNN and oneDNN are switched off while counting: their fused RNN kernels are opaque to
    FlopCounterMode, while the plain path decomposes into the same matmuls it can count.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")  # torch's own note on toggling oneDNN
        with torch.backends.cudnn.flags(enabled=False), torch.backends.mkldnn.flags(enabled=False), FlopCounterMode(display=False) as counter:
            loss_fn(model, batch)["loss"].backward()
    for parameter in model.parameters():
        parameter.grad = None
    flops = counter.get_total_flops()
    return float(flops) if flops > 0 else None
