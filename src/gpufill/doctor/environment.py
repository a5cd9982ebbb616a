"""Environment checks: what the software and the device can do, and settings that slow trainings.

Each check is a :class:`Check` record (name, value, status, note). ``warn`` marks something
that costs speed now (``CUDA_LAUNCH_BLOCKING=1``, more OpenMP threads than cores);
``info`` is a fact worth knowing; ``ok`` a capability that is there and switched on.
Device facts come from :func:`gpufill.engine.hardware.detect` (passed in, never re-read here);
NVML is opened through the monitor's own :func:`~gpufill.monitor.sampler.open_gpu_source`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import psutil
import torch

from gpufill.engine.hardware import Hardware, free_memory_bytes
from gpufill.monitor.sampler import NvmlSource, open_gpu_source

__all__ = ["Check", "Status", "check_environment", "check_variables", "load_check"]

Status = Literal["ok", "warn", "info"]

# The variables that change how fast (or whether) a training runs on this machine.
VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING")
# Flash attention kernels need Ampere (sm_80) or newer.
FLASH_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True, slots=True)
class Check:
    """One environment fact and whether it helps or hurts speed."""

    name: str
    value: str
    status: Status
    note: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def check_environment(hardware: Hardware, *, environ: Mapping[str, str] | None = None, nvml: Any | None = None) -> list[Check]:
    """All checks for `hardware`, in reading order: software, device, host, variables.

    `environ` defaults to ``os.environ``; `nvml` is the NVML module (a fake in tests; None
    imports ``pynvml``).
    """
    environ = os.environ if environ is None else environ
    return [
        Check("python", platform.python_version(), "info", platform.python_implementation()),
        Check("torch", torch.__version__, "info", "built with CUDA" if torch.version.cuda else "CPU-only build"),
        *_cuda_checks(hardware, nvml),
        *_device_checks(hardware),
        *_precision_checks(hardware),
        *_attention_checks(hardware),
        *_host_checks(hardware),
        *check_variables(environ, hardware.cpu_count),
    ]


def _cuda_checks(hardware: Hardware, nvml: Any | None) -> list[Check]:
    cuda = torch.version.cuda
    runtime = Check(
        "CUDA (torch build)",
        cuda or "n/a",
        "info" if cuda or not hardware.is_cuda else "warn",
        "the CUDA runtime torch was built against" if cuda else "this torch build has no CUDA: install a CUDA wheel to use a GPU",
    )
    return [runtime, _nvml_check(hardware, nvml)]


def _nvml_check(hardware: Hardware, nvml: Any | None) -> Check:
    """NVML (nvidia-ml-py) is what `gpufill monitor` and campaign sampling read GPUs through."""
    source = open_gpu_source(nvml)
    if source is None:
        return Check(
            "NVML / driver",
            "unavailable",
            "warn" if hardware.is_cuda else "info",
            "GPU sampling is off (CPU and RAM only): install nvidia-ml-py and check the driver"
            if hardware.is_cuda
            else "no NVIDIA driver or GPU: campaign monitoring samples CPU and RAM only",
        )
    try:
        driver = _driver_version(source)
        count = source.count()
    finally:
        if isinstance(source, NvmlSource):
            source.close()
    return Check("NVML / driver", driver, "ok", f"NVML sees {count} GPU(s): utilisation, memory, power and clocks are sampled")


def _driver_version(source: Any) -> str:
    read = getattr(getattr(source, "nvml", None), "nvmlSystemGetDriverVersion", None)
    if read is None:
        return "available"
    version = read()
    return version.decode() if isinstance(version, bytes) else str(version)  # older nvidia-ml-py returns bytes


def _device_checks(hardware: Hardware) -> list[Check]:
    gib = hardware.total_memory_bytes / 2**30
    if not hardware.is_cuda:
        return [
            Check("device", f"{hardware.device} ({hardware.name})", "info", "no CUDA GPU visible: trainings run on the CPU"),
            Check("memory", f"{gib:.1f} GiB RAM", "info", f"{_free_gib(hardware)} available now"),
        ]
    names = [hardware.name]
    if torch.cuda.is_available():  # the facts may describe a GPU this process cannot open (tests, remote plans)
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    capability = ".".join(map(str, hardware.compute_capability or ()))
    return [
        Check("GPU(s)", "; ".join(f"{i}: {name}" for i, name in enumerate(names)), "ok", f"diagnosing {hardware.device}"),
        Check("memory", f"{gib:.1f} GiB", "info", f"{_free_gib(hardware)} free now" if torch.cuda.is_available() else "total"),
        Check(
            "compute capability",
            f"sm_{capability.replace('.', '')} ({capability})",
            "ok" if hardware.compute_capability and hardware.compute_capability >= (8, 0) else "info",
            f"peak table: {hardware.peak_name}" if hardware.peak_name else "not in gpufill's peak table: ratios to peak are n/a",
        ),
    ]


def _free_gib(hardware: Hardware) -> str:
    return f"{free_memory_bytes(hardware) / 2**30:.1f} GiB"


def _precision_checks(hardware: Hardware) -> list[Check]:
    if not hardware.is_cuda:
        bf16 = Check(
            "bf16",
            "fast" if hardware.bf16_supported else "slow",
            "ok" if hardware.bf16_supported else "info",
            "this CPU has AMX/AVX512-BF16" if hardware.bf16_supported else "no AMX/AVX512-BF16 on this CPU: gpufill trains in fp32 here",
        )
        return [bf16, Check("TF32", "n/a", "info", "TF32 is a GPU tensor-core format (sm_80+)")]
    bf16 = Check(
        "bf16",
        "supported" if hardware.bf16_supported else "not supported",
        "ok" if hardware.bf16_supported else "info",
        "gpufill trains in bf16 autocast here" if hardware.bf16_supported else "gpufill uses fp16 with loss scaling instead",
    )
    enabled = torch.backends.cuda.matmul.allow_tf32
    tf32 = Check(
        "TF32",
        "supported" if hardware.tf32_supported else "not supported",
        "ok" if hardware.tf32_supported else "info",
        (f"torch's fp32 matmuls use it now: {enabled}; gpufill.fit turns it on for its trainings")
        if hardware.tf32_supported
        else "TF32 tensor cores need sm_80+: fp32 matmuls run on the plain FP32 units",
    )
    return [bf16, tf32]


def _attention_checks(hardware: Hardware) -> list[Check]:
    """Which fused attention kernels scaled_dot_product_attention may pick (transformer family)."""
    if not hardware.is_cuda:
        return [Check("SDPA kernels", "CPU", "info", "flash / memory-efficient attention are CUDA kernels; the CPU has its own fused path")]
    flash_flag = torch.backends.cuda.flash_sdp_enabled()
    arch_ok = bool(hardware.compute_capability and hardware.compute_capability >= FLASH_MIN_CAPABILITY)
    if flash_flag and arch_ok:
        flash = Check("SDPA flash", "available", "ok", "enabled, and the GPU is sm_80+")
    elif not arch_ok:
        flash = Check("SDPA flash", "unavailable", "info", "flash attention needs sm_80+: the memory-efficient kernel is used instead")
    else:
        flash = Check("SDPA flash", "disabled", "warn", "switched off in this process (torch.backends.cuda.enable_flash_sdp(False))")
    efficient = torch.backends.cuda.mem_efficient_sdp_enabled()
    memory = Check(
        "SDPA memory-efficient",
        "enabled" if efficient else "disabled",
        "ok" if efficient else "warn",
        "fallback fused kernel for attention" if efficient else "switched off: attention may fall back to the unfused math kernel",
    )
    return [flash, memory]


def _host_checks(hardware: Hardware) -> list[Check]:
    threads = torch.get_num_threads()
    cores = hardware.cpu_count
    if threads > cores:
        thread_check = Check("torch threads", str(threads), "warn", f"more intra-op threads than the {cores} usable cores: they compete; OMP_NUM_THREADS={cores} in the "
                                                                 f"environment (torch.set_num_threads also pins MKL's threads: CPU attention 1.8x slower)")
    else:
        thread_check = Check("torch threads", str(threads), "ok", f"within the {cores} usable cores")
    return [
        Check("CPU cores", str(cores), "info", "usable by this process (affinity-aware); data loading and the CPU lane share them"),
        thread_check,
        load_check(psutil.getloadavg()[0], psutil.cpu_count() or cores, threads),
    ]


def load_check(load: float, logical_cpus: int, threads: int = 1) -> Check:
    """Other processes on the cores make every timing below slower and noisier than the machine is."""
    if load <= logical_cpus:
        return Check("host load", f"{load:.1f}", "ok", f"1-minute load average within the {logical_cpus} CPUs")
    note = f"1-minute load average above the {logical_cpus} CPUs: other processes compete, so the timings below read slow"
    if threads > 1:
        # OpenMP threads wait for each other at the end of every op; a descheduled one stalls them all.
        note += f"; torch's {threads} threads stall each other when a core is taken: torch.set_num_threads(1) or fewer jobs at once"
    return Check("host load", f"{load:.1f}", "warn", note)


def check_variables(environ: Mapping[str, str], cores: int) -> list[Check]:
    """One check per variable that changes speed, set or not."""
    return [_variable(name, environ.get(name), cores) for name in VARIABLES]


def _variable(name: str, value: str | None, cores: int) -> Check:
    if value is None:
        notes = {
            "PYTORCH_CUDA_ALLOC_CONF": "default caching allocator",
            "OMP_NUM_THREADS": "torch picks one thread per core",
            "MKL_NUM_THREADS": "MKL follows torch's thread count",
            "CUDA_VISIBLE_DEVICES": "every GPU is visible",
            "CUDA_LAUNCH_BLOCKING": "kernel launches are asynchronous",
        }
        return Check(name, "unset", "info", notes[name])
    if name == "CUDA_LAUNCH_BLOCKING":
        if value.strip() == "1":
            return Check(name, value, "warn", "every kernel launch waits for the GPU (a debugging setting): unset it for training")
        return Check(name, value, "info", "launches stay asynchronous (only 1 blocks)")
    if name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        return _thread_variable(name, value, cores)
    if name == "CUDA_VISIBLE_DEVICES" and value.strip() == "":
        return Check(name, "(empty)", "warn", "hides every GPU from this process: unset it or list device ids")
    return Check(name, value, "info", "set")


def _thread_variable(name: str, value: str, cores: int) -> Check:
    try:
        threads = int(value)
    except ValueError:
        return Check(name, value, "warn", "not an integer: the runtime ignores it or fails; set a thread count")
    if threads > cores:
        return Check(name, value, "warn", f"more threads than the {cores} usable cores: they time-share and slow each other; set it to {cores} or less")
    return Check(name, value, "ok", f"within the {cores} usable cores")
