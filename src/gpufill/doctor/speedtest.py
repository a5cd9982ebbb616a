"""Speed test: what this device delivers right now, next to its datasheet peak.

Two numbers bound every training: the matmul rate (square matmuls, TFLOP/s) and the
memory bandwidth (a large tensor copy, GB/s counting the bytes read and the bytes
written). Each is the best of a few timed repetitions after a warm-up, so a moment of
contention from another process does not lower it. On a device without a peak-table
entry (every CPU) the ratio to peak is None ("n/a"), never a guess.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from gpufill.engine.hardware import Hardware
from gpufill.engine.backend import synchronize

__all__ = ["Rate", "SpeedTest", "SpeedTestSizes", "precisions", "run_speed_test"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedTestSizes:
    """Problem sizes: big enough to reach the device's rate, small enough to take seconds."""

    matmul_n: int
    """Side of the square matrices."""
    copy_bytes: int
    """Bytes of the copied tensor (read once and written once per copy)."""
    reps: int = 5
    """Timed repetitions; the best is kept."""

    @classmethod
    def for_device(cls, hardware: Hardware) -> SpeedTestSizes:
        if hardware.is_cuda:
            # 8192^3 keeps tensor cores busy for milliseconds; 1 GiB is far beyond any L2 cache.
            return cls(matmul_n=8192, copy_bytes=2**30)
        # ~2 GFLOP per matmul and 64 MiB (beyond the last-level cache): the whole test takes
        # well under a second on two cores; 10 reps give a busy host more chances of a clean one.
        return cls(matmul_n=1024, copy_bytes=64 * 2**20, reps=10)


@dataclass(frozen=True, kw_only=True, slots=True)
class Rate:
    """One measured rate and its ratio to the datasheet peak (None: no table entry)."""

    name: str
    value: float
    unit: str
    peak: float | None
    detail: str

    @property
    def ratio(self) -> float | None:
        return None if self.peak is None else self.value / self.peak

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": round(self.value, 4),
            "unit": self.unit,
            "peak": self.peak if self.peak is not None else "n/a",
            "ratio_to_peak": round(self.ratio, 4) if self.ratio is not None else "n/a",
            "detail": self.detail,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedTest:
    """Matmul rates per precision and the memory copy rate of one device."""

    device: str
    matmul: tuple[Rate, ...]
    """fp32 first, then tf32 / bf16 where the GPU has them."""
    memory: Rate
    seconds: float

    def matmul_tflops(self, name: str) -> float | None:
        """The measured rate of precision `name` ("fp32", "tf32", "bf16"), or None when not measured."""
        return next((rate.value for rate in self.matmul if rate.name == name), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "device": self.device,
            "matmul_tflops": {rate.name: rate.to_dict() for rate in self.matmul},
            "memory_gbps": self.memory.to_dict(),
            "seconds": round(self.seconds, 3),
        }




def best_seconds(work: Callable[[], object], device: torch.device, *, reps: int, warmup: int = 1) -> float:
    """Fastest of `reps` timed calls of `work`, each ended by a device sync."""
    for _ in range(warmup):  # first calls pay for allocation, kernel selection and lazy init
        work()
    synchronize(device)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        work()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def _matmul_tf32(enabled: bool) -> Iterator[None]:
    """TF32 for fp32 matmuls only while measuring it; the process's setting is restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def precisions(hardware: Hardware) -> list[tuple[str, torch.dtype, bool, float | None]]:
    """(name, dtype, TF32 on, peak TFLOP/s) for each precision worth measuring on `hardware`."""
    peak = hardware.peak
    rows = [("fp32", torch.float32, False, peak.fp32_tflops if peak else None)]
    if hardware.is_cuda and hardware.tf32_supported:
        rows.append(("tf32", torch.float32, True, peak.tf32_tflops if peak else None))
    if hardware.is_cuda and hardware.bf16_supported:
        rows.append(("bf16", torch.bfloat16, False, peak.bf16_tflops if peak else None))
    return rows


def measure_matmul(hardware: Hardware, sizes: SpeedTestSizes) -> tuple[Rate, ...]:
    device = torch.device(hardware.device)
    n = sizes.matmul_n
    rates = []
    for name, dtype, tf32, peak in precisions(hardware):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        with _matmul_tf32(tf32):
            seconds = best_seconds(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), device, reps=sizes.reps)
        rates.append(Rate(name=name, value=2 * n**3 / seconds / 1e12, unit="TFLOP/s", peak=peak,
                          detail=f"{n}x{n} @ {n}x{n}, best of {sizes.reps}"))
        del a, b, out
    return tuple(rates)


def measure_memory(hardware: Hardware, sizes: SpeedTestSizes) -> Rate:
    device = torch.device(hardware.device)
    count = sizes.copy_bytes // 4
    source = torch.ones(count, device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), device, reps=sizes.reps)
    moved = 2 * count * 4  # every byte is read once and written once
    return Rate(
        name="copy",
        value=moved / seconds / 1e9,
        unit="GB/s",
        peak=hardware.peak.memory_gbps if hardware.peak else None,
        detail=f"{sizes.copy_bytes / 2**20:.0f} MiB copy, read + write bytes, best of {sizes.reps}",
    )


def run_speed_test(hardware: Hardware, sizes: SpeedTestSizes | None = None) -> SpeedTest:
    """Measure matmul TFLOP/s per precision and copy GB/s on `hardware`'s device."""
    sizes = sizes or SpeedTestSizes.for_device(hardware)
    start = time.perf_counter()
    matmul = measure_matmul(hardware, sizes)
    memory = measure_memory(hardware, sizes)
    if hardware.is_cuda:
        torch.cuda.empty_cache()  # hand the test's gigabyte back before the training profile
    return SpeedTest(device=hardware.device, matmul=matmul, memory=memory, seconds=time.perf_counter() - start)
