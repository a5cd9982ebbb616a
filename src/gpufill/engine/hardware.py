"""Device facts: what the machine can do, read once, never guessed.

`detect()` reads the device through torch (name, memory, compute capability, SM count,
bf16/TF32 support) and the CPU through os/psutil. Peak throughput comes from a table
keyed by device name (dense, no sparsity, from the vendors' datasheets); a device that
is not in the table reports "n/a" rather than a wrong number.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass

import psutil
import torch

from gpufill.cpus import usable_cpus
from gpufill.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakThroughput:
    """Datasheet peaks: dense tensor-core TFLOP/s per precision and memory GB/s (None: not supported)."""

    bf16_tflops: float | None
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float
    memory_gbps: float


# Ordered: the first pattern that matches the device name wins, so specific names
# (H100 PCIe, A100 80GB) come before generic ones (H100, A100).
_PEAKS: tuple[tuple[str, str, PeakThroughput], ...] = (
    ("H200", r"H200", PeakThroughput(bf16_tflops=989.5, fp16_tflops=989.5, tf32_tflops=494.7, fp32_tflops=66.9, memory_gbps=4800)),
    ("H100 NVL", r"H100.*NVL", PeakThroughput(bf16_tflops=835.5, fp16_tflops=835.5, tf32_tflops=417.5, fp32_tflops=60.0, memory_gbps=3900)),
    ("H100 PCIe", r"H100.*PCIe", PeakThroughput(bf16_tflops=756.5, fp16_tflops=756.5, tf32_tflops=378.0, fp32_tflops=51.2, memory_gbps=2000)),
    ("H100 SXM", r"H100", PeakThroughput(bf16_tflops=989.5, fp16_tflops=989.5, tf32_tflops=494.7, fp32_tflops=66.9, memory_gbps=3350)),
    ("A100 80GB PCIe", r"A100.*80GB.*PCIe|A100-PCIE-80GB", PeakThroughput(bf16_tflops=312, fp16_tflops=312, tf32_tflops=156, fp32_tflops=19.5, memory_gbps=1935)),
    ("A100 80GB SXM", r"A100.*80GB", PeakThroughput(bf16_tflops=312, fp16_tflops=312, tf32_tflops=156, fp32_tflops=19.5, memory_gbps=2039)),
    ("A100 40GB", r"A100", PeakThroughput(bf16_tflops=312, fp16_tflops=312, tf32_tflops=156, fp32_tflops=19.5, memory_gbps=1555)),
    ("L40S", r"L40S", PeakThroughput(bf16_tflops=362.1, fp16_tflops=362.1, tf32_tflops=183.0, fp32_tflops=91.6, memory_gbps=864)),
    ("RTX A6000", r"RTX A6000", PeakThroughput(bf16_tflops=154.8, fp16_tflops=154.8, tf32_tflops=77.4, fp32_tflops=38.7, memory_gbps=768)),
    ("A10", r"\bA10\b", PeakThroughput(bf16_tflops=125, fp16_tflops=125, tf32_tflops=62.5, fp32_tflops=31.2, memory_gbps=600)),
    ("L4", r"\bL4\b", PeakThroughput(bf16_tflops=121, fp16_tflops=121, tf32_tflops=60, fp32_tflops=30.3, memory_gbps=300)),
    ("RTX 4090", r"RTX 4090", PeakThroughput(bf16_tflops=165.2, fp16_tflops=165.2, tf32_tflops=82.6, fp32_tflops=82.6, memory_gbps=1008)),
    ("RTX 3090", r"RTX 3090", PeakThroughput(bf16_tflops=71, fp16_tflops=71, tf32_tflops=35.6, fp32_tflops=35.6, memory_gbps=936)),
    ("V100", r"V100", PeakThroughput(bf16_tflops=None, fp16_tflops=125, tf32_tflops=None, fp32_tflops=15.7, memory_gbps=900)),
    ("T4", r"\bT4\b", PeakThroughput(bf16_tflops=None, fp16_tflops=65, tf32_tflops=None, fp32_tflops=8.1, memory_gbps=320)),
)


def peak_for(device_name: str) -> tuple[str, PeakThroughput] | None:
    """The table entry (canonical name, peaks) for a device name, or None when unknown."""
    for canonical, pattern, peak in _PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return canonical, peak
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """Facts about the device a training runs on (plus the host's CPU)."""

    device: str
    """torch device string: "cuda:0", "cpu" or "mps"."""
    device_type: str
    """"cuda", "cpu" or "mps"."""
    name: str
    """Device name as the driver reports it (CPU model name on CPU)."""
    total_memory_bytes: int
    """Device memory (CUDA) or system RAM (CPU, MPS)."""
    compute_capability: tuple[int, int] | None
    sm_count: int | None
    bf16_supported: bool
    tf32_supported: bool
    """TF32 tensor cores exist from compute capability 8.0 (Ampere)."""
    cpu_count: int
    """Cores this process may use (affinity-aware)."""
    peak_name: str | None
    peak: PeakThroughput | None

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready facts; unknown peaks are "n/a", never a guess."""
        facts = {
            "device": self.device,
            "device_type": self.device_type,
            "name": self.name,
            "total_memory_gib": round(self.total_memory_bytes / 2**30, 2),
            "compute_capability": ".".join(map(str, self.compute_capability)) if self.compute_capability else "n/a",
            "sm_count": self.sm_count if self.sm_count is not None else "n/a",
            "bf16_supported": self.bf16_supported,
            "tf32_supported": self.tf32_supported,
            "cpu_count": self.cpu_count,
            "peak_table_entry": self.peak_name or "n/a",
        }
        peaks = asdict(self.peak) if self.peak else dict.fromkeys(PeakThroughput.__dataclass_fields__)
        facts.update({key: ("n/a" if value is None else value) for key, value in peaks.items()})
        return facts


def cpu_count() -> int:
    """Cores this process may use: its affinity (taskset, cpusets) capped by its cgroup's CPU quota (gpufill.cpus)."""
    return usable_cpus()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> the first CUDA device if there is one, else MPS, else CPU."""
    if str(device) != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def check_device(device: str | torch.device, *, where: str | None = None, field: str = "device") -> torch.device:
    """"auto" or a device this process can use, else an InputError that says which exist."""
    if str(device) == "auto":
        return resolve_device("auto")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise InputError(f"unknown device {str(device)!r}", where=where, field=field, fix="pass auto, cpu, cuda or cuda:N") from error
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"device {str(device)!r}: no CUDA GPU is visible to this process", where=where, field=field,
                             fix="use the CPU (device cpu, or auto), or check the driver and CUDA_VISIBLE_DEVICES")
        index = parsed.index if parsed.index is not None else torch.cuda.current_device()
        if index >= count:
            raise InputError(f"device {str(device)!r}: only {count} CUDA GPU(s) visible", where=where, field=field,
                             fix=f"pass a device from cuda:0 to cuda:{count - 1}")
        return torch.device("cuda", index)
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise InputError("device 'mps' is not available here", where=where, field=field, fix="use cpu or auto")
    return parsed


def detect(device: str | torch.device = "auto") -> Hardware:
    """Read the facts of `device` ("auto": the best one available)."""
    dev = resolve_device(device)
    cores = cpu_count()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        entry = peak_for(props.name)
        return Hardware(
            device=f"cuda:{index}",
            device_type="cuda",
            name=props.name,
            total_memory_bytes=int(props.total_memory),
            compute_capability=capability,
            sm_count=int(props.multi_processor_count),
            bf16_supported=bool(torch.cuda.is_bf16_supported()),
            tf32_supported=capability >= (8, 0),
            cpu_count=cores,
            peak_name=entry[0] if entry else None,
            peak=entry[1] if entry else None,
        )
    return Hardware(
        device=str(dev),
        device_type=dev.type,
        name=_cpu_name() if dev.type == "cpu" else "Apple GPU (MPS)",
        total_memory_bytes=int(psutil.virtual_memory().total),
        compute_capability=None,
        sm_count=None,
        # CPU autocast supports bf16 everywhere, but it only runs fast with AMX/AVX512-BF16.
        bf16_supported=dev.type == "cpu" and _cpu_has_fast_bf16(),
        tf32_supported=False,
        cpu_count=cores,
        peak_name=None,
        peak=None,
    )


CPU_BF16_ENVIRONMENT = "GPUFILL_CPU_BF16"
"""Set to 0: this CPU is taken as one without fast bf16, so gpufill never picks bf16 on it unless a training asks for it.
bf16 changes a training's numbers (within the live trial's loss tolerance, not bit for bit), and whether it is chosen
depends on timing; the test suite sets 0, so that what it asserts does not depend on the CPU or the load it runs on."""


def _cpu_has_fast_bf16() -> bool:
    if os.environ.get(CPU_BF16_ENVIRONMENT, "").strip() == "0":
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def fused_optimizer_devices() -> list[str]:
    """Device types this torch has fused Adam/AdamW/SGD kernels for."""
    from torch.optim import optimizer as torch_optimizer

    # A private helper, so read defensively: older torch had fused kernels on CUDA only.
    return list(getattr(torch_optimizer, "_get_fused_kernels_supported_devices", lambda: ["cuda"])())


def free_memory_bytes(hardware: Hardware) -> int:
    """Memory free right now on the device (CUDA) or in RAM (CPU, MPS)."""
    if hardware.is_cuda:
        free, _total = torch.cuda.mem_get_info(torch.device(hardware.device))
        return int(free)
    return int(psutil.virtual_memory().available)


def context_bytes(device: str) -> int | None:
    """Device memory this process holds beyond PyTorch's allocator (its CUDA context, library
    workspaces), from NVML's per-process accounting; None off a GPU or without NVML."""
    if not device.startswith("cuda"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        index = torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        physical = int(visible.split(",")[index]) if visible and visible.split(",")[index].strip().isdigit() else index
        handle = pynvml.nvmlDeviceGetHandleByIndex(physical)
        used = next((p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()), None)
        return None if used is None else max(0, int(used) - int(torch.cuda.memory_reserved()))
    except Exception:  # noqa: BLE001 - NVML absent or restricted (containers): admission uses its default
        return None
