import pytest

from gpufill.engine.hardware import cpu_count, detect, peak_for
from tests.fakes import CPU, H100


@pytest.mark.parametrize(
    ("name", "canonical", "bf16", "memory_gbps"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 3350),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 2000),
        ("NVIDIA H200", "H200", 989.5, 4800),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312, 2039),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 312, 1935),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 312, 1555),
        ("NVIDIA RTX A6000", "RTX A6000", 154.8, 768),
        ("NVIDIA L4", "L4", 121, 300),
        ("Tesla T4", "T4", None, 320),
        ("Tesla V100-SXM2-16GB", "V100", None, 900),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 71, 936),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2, 1008),
    ],
)
def test_peak_table_knows_the_common_gpus(name, canonical, bf16, memory_gbps):
    found, peak = peak_for(name)
    assert found == canonical
    assert peak.bf16_tflops == bf16
    assert peak.memory_gbps == memory_gbps
    assert peak.fp32_tflops > 0


def test_unknown_device_reports_not_available_instead_of_a_guess():
    assert peak_for("NVIDIA GeForce GTX 1080") is None
    assert peak_for("NVIDIA L40") is None  # L40S is known, L40 is not: no prefix guess
    facts = CPU.to_dict()
    assert facts["bf16_tflops"] == "n/a" and facts["memory_gbps"] == "n/a" and facts["peak_table_entry"] == "n/a"


def test_known_device_facts_serialise():
    facts = H100.to_dict()
    assert facts["compute_capability"] == "9.0"
    assert facts["peak_table_entry"] == "H100 SXM"
    assert facts["tf32_tflops"] == 494.7
    assert facts["total_memory_gib"] == 80.0


def test_detect_cpu_reads_this_machine():
    hw = detect("cpu")
    assert hw.device == "cpu" and hw.device_type == "cpu"
    assert hw.cpu_count == cpu_count() >= 1
    assert hw.total_memory_bytes > 2**30
    assert hw.compute_capability is None and hw.peak is None and not hw.tf32_supported
