"""Mean GPU utilisation during one run, from the monitor's NVML sampler (a column of `gpufill bench`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gpufill.monitor.sampler import GpuSource, Sampler, open_gpu_source


class UtilisationMeter:
    """Mean GPU utilisation during a run, from the monitor's Sampler (NVML), one reading per `interval` s.

    Measures nothing (None) on a CPU run or without NVML. NVML numbers GPUs in PCI order
    and ignores CUDA_VISIBLE_DEVICES, so a torch index is mapped through that variable when
    it lists indices (on a one-GPU machine both are 0).
    """

    def __init__(self, device: torch.device | str, *, interval: float = 0.2, source: GpuSource | None | str = "auto"):
        self.device = torch.device(device)
        self.interval = interval
        if source == "auto":
            source = open_gpu_source() if self.device.type == "cuda" else None
        self.source: GpuSource | None = source  # type: ignore[assignment]
        self.gpu = f"gpu{_nvml_index(self.device)}"

    @contextmanager
    def measure(self) -> Iterator[list[float]]:
        """Yields the list the readings (percent) go into; it is complete when the block ends."""
        readings: list[float] = []
        if self.source is None:
            yield readings
            return

        def keep(rows: list[dict[str, Any]]) -> None:
            readings.extend(row["gpu_util"] for row in rows if row["source"] == self.gpu and row["gpu_util"] is not None)

        sampler = Sampler(self.interval, gpu_source=self.source, sink=keep)
        with sampler:
            yield readings
        if not readings:  # a run shorter than the thread's first reading: read once at its end
            keep(sampler.read())

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def _nvml_index(device: torch.device) -> int:
    index = device.index or 0
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if device.type == "cuda" and index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index
