"""`gpufill doctor`: environment checks, a speed test, and a bottleneck verdict for one training.

:func:`run` diagnoses gpufill's own forecaster (or any registered family) the way users
train it before gpufill; :func:`diagnose` does the same for any model and data. Both
return a :class:`DoctorReport` whose ``to_dict()`` is the ``--json`` output.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpufill.doctor.bottleneck import PhaseTimings, Verdict, Yardstick, classify
from gpufill.doctor.environment import Check, check_environment
from gpufill.doctor.profiler import TrainingData, check_positive, profile_training
from gpufill.doctor.speedtest import SpeedTest, SpeedTestSizes, run_speed_test
from gpufill.doctor.target import check_device, forecaster_training
from gpufill.engine import losses
from gpufill.engine.config import DEFAULTS
from gpufill.engine.hardware import Hardware, detect, free_memory_bytes
from gpufill.engine.inputs import as_source

__all__ = ["DoctorReport", "diagnose", "run", "yardstick"]


@dataclass(slots=True)
class DoctorReport:
    """Everything the doctor found, JSON-ready through :meth:`to_dict`."""

    hardware: Hardware
    environment: list[Check]
    speed_test: SpeedTest
    description: str
    timings: PhaseTimings
    data_bytes: int | None
    verdict: Verdict
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        t = self.timings
        achieved = t.achieved_tflops
        return {
            "hardware": self.hardware.to_dict(),
            "environment": [check.to_dict() for check in self.environment],
            "speed_test": self.speed_test.to_dict(),
            "training": {
                "description": self.description,
                "device": self.hardware.device,
                "batch_size": t.batch_size,
                "steps": t.steps,
                "data_bytes": self.data_bytes,
                "step_s": round(t.step_s, 6),
                "phases_s": {"data_wait": t.data_s, "copy": t.copy_s, "forward": t.forward_s, "backward": t.backward_s, "optimizer": t.optimizer_s},
                "shares": {name: round(share, 4) for name, share in t.shares.items()},
                "scaling": {
                    "batch": t.batch_size,
                    "compute_b_s": t.compute_b_s,
                    "compute_2b_s": t.compute_2b_s,
                    "ratio_2b_over_b": None if t.scaling is None else round(t.scaling, 3),
                },
                "flops_per_step": t.flops_per_step,
                "achieved_tflops": None if achieved is None else round(achieved, 5),
                "syncs_per_step": t.syncs_per_step,
            },
            "verdict": self.verdict.to_dict(),
            "seconds": round(self.seconds, 2),
        }


def yardstick(hardware: Hardware, speed: SpeedTest, *, data_bytes: int | None, free_bytes: int | None) -> Yardstick:
    """The verdict's reference numbers from the speed test and the device facts."""
    fp32 = speed.matmul_tflops("fp32")
    assert fp32 is not None, "the speed test always measures fp32"
    fast: str | None = None
    ratio: float | None = None
    source = ""
    bf16 = speed.matmul_tflops("bf16")
    if hardware.is_cuda and bf16 is not None:
        fast, ratio, source = "bf16", bf16 / fp32, "measured by the speed test"
    elif hardware.is_cuda and hardware.peak is not None and hardware.peak.fp16_tflops:
        # No bf16 (pre-Ampere): fp16 with loss scaling; its rate comes from the datasheet table.
        fast, ratio, source = "fp16", hardware.peak.fp16_tflops / hardware.peak.fp32_tflops, f"{hardware.peak_name} datasheet peaks"
    return Yardstick(
        device_type=hardware.device_type,
        cpu_count=hardware.cpu_count,
        matmul_tflops=fp32,
        memory_gbps=speed.memory.value,
        fast_precision=fast,
        fast_matmul_ratio=ratio,
        fast_ratio_source=source,
        data_bytes=data_bytes,
        free_bytes=free_bytes,
    )


def diagnose(
    model: nn.Module,
    data: TrainingData,
    *,
    loss: Any = "mse",
    batch_size: int = 128,
    lr: float = DEFAULTS.lr,
    steps: int = 20,
    device: str = "auto",
    description: str | None = None,
    data_bytes: int | None = None,
    speed_sizes: SpeedTestSizes | None = None,
    environ: Mapping[str, str] | None = None,
) -> DoctorReport:
    """Check the environment, run the speed test, profile `model` on `data` and give the verdict.

    `data` and `loss` take what fit takes: tensors of any structure (batched by index on their
    own device), a Dataset or IterableDataset (through a plain DataLoader of `batch_size`), a
    DataLoader (used as given); a loss name or `fn(model, batch)`. The model is copied; its
    weights do not change.
    """
    start = time.perf_counter()
    check_positive(batch_size=batch_size, steps=steps)
    losses.resolve(loss)  # an unknown loss fails before the speed test
    hardware = detect(check_device(device))
    environment = check_environment(hardware, environ=environ)
    speed = run_speed_test(hardware, speed_sizes)
    if data_bytes is None:
        data_bytes = as_source(data, "data").nbytes or None  # tensors: what moving them to the device would take
    timings = profile_training(model, data, batch_size=batch_size, steps=steps, device=hardware.device, lr=lr, loss=loss,
                               matmul_n=(speed_sizes or SpeedTestSizes.for_device(hardware)).matmul_n)
    if hardware.is_cuda:
        torch.cuda.empty_cache()  # the profile's copies are gone: free memory reads true for the data-fit check
    verdict = classify(timings, yardstick(hardware, speed, data_bytes=data_bytes, free_bytes=free_memory_bytes(hardware)))
    return DoctorReport(
        hardware=hardware,
        environment=environment,
        speed_test=speed,
        description=description or _describe(model, data, loss, timings.batch_size),
        timings=timings,
        data_bytes=data_bytes,
        verdict=verdict,
        seconds=time.perf_counter() - start,
    )


def _describe(model: nn.Module, data: TrainingData, loss: Any, batch: int) -> str:
    count = sum(p.numel() for p in model.parameters())
    loss_name = losses.resolve(loss)[1].value
    return f"{type(model).__name__} ({count:,} parameters) on {type(data).__name__} data, batch {batch}, loss {loss_name}, fp32 Adam"


def run(
    *,
    model: str = "lstm",
    data: str = "synthetic",
    batch_size: int = 128,
    lookback: int = 30,
    steps: int = 20,
    device: str = "auto",
    params: Mapping[str, Any] | None = None,
    speed_sizes: SpeedTestSizes | None = None,
) -> DoctorReport:
    """Diagnose a gpufill forecaster (family name or ``package.module:factory``) trained the guides' way."""
    check_positive(steps=steps)
    check_device(device)  # before loading data: a bad option fails in milliseconds
    training = forecaster_training(model, data=data, batch_size=batch_size, lookback=lookback, params=params)
    return diagnose(training.model, training.data, batch_size=training.batch_size, steps=steps, device=device,
                    description=training.description, data_bytes=training.data_bytes, speed_sizes=speed_sizes)
