"""Hardware descriptions of devices we do not have, for plan tests."""

from __future__ import annotations

from gpufill.engine.hardware import Hardware, peak_for


def gpu(name: str, capability: tuple[int, int], memory_gib: float = 80, cpus: int = 16) -> Hardware:
    entry = peak_for(name)
    return Hardware(
        device="cuda:0",
        device_type="cuda",
        name=name,
        total_memory_bytes=int(memory_gib * 2**30),
        compute_capability=capability,
        sm_count=132,
        bf16_supported=capability >= (8, 0),
        tf32_supported=capability >= (8, 0),
        cpu_count=cpus,
        peak_name=entry[0] if entry else None,
        peak=entry[1] if entry else None,
    )


H100 = gpu("NVIDIA H100 80GB HBM3", (9, 0))
T4 = gpu("Tesla T4", (7, 5), memory_gib=16)
CPU = Hardware(
    device="cpu",
    device_type="cpu",
    name="AMD EPYC",
    total_memory_bytes=24 * 2**30,
    compute_capability=None,
    sm_count=None,
    bf16_supported=False,
    tf32_supported=False,
    cpu_count=2,
    peak_name=None,
    peak=None,
)
