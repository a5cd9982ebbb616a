import os

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


def test_gpufill_cpu_bf16_0_hides_the_cpus_bf16_and_unset_reads_its_flags(monkeypatch):
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        flags = next((line for line in cpuinfo if line.startswith("flags")), "")
    has = "amx_bf16" in flags or "avx512_bf16" in flags
    assert os.environ["GPUFILL_CPU_BF16"] == "0"  # tests/conftest.py: the suite's results do not depend on the CPU
    assert detect("cpu").bf16_supported is False
    monkeypatch.delenv("GPUFILL_CPU_BF16")
    assert detect("cpu").bf16_supported is has
    monkeypatch.setenv("GPUFILL_CPU_BF16", "1")
    assert detect("cpu").bf16_supported is has


def _cgroup(tmp_path, membership: str, files: dict[str, str]):
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    (tmp_path / "self-cgroup").write_text(membership)
    return root, tmp_path / "self-cgroup"


def test_a_cgroup_cpu_quota_caps_the_usable_cores(tmp_path):
    import os

    from gpufill.cpus import cpu_quota, usable_cpus

    affinity = len(os.sched_getaffinity(0))
    # cgroup v2: the job's own quota, its parent unlimited; the smallest on the way up counts.
    root, member = _cgroup(tmp_path / "v2", "0::/user.slice/job\n", {"user.slice/job/cpu.max": "150000 100000\n", "user.slice/cpu.max": "max 100000\n"})
    assert cpu_quota(root, member) == 1.5 and usable_cpus(root, member) == min(affinity, 2)
    root, member = _cgroup(tmp_path / "v2p", "0::/a/b\n", {"a/b/cpu.max": "800000 100000\n", "a/cpu.max": "100000 100000\n"})
    assert cpu_quota(root, member) == 1.0 and usable_cpus(root, member) == 1
    # cgroup v1, its cpu controller mounted as cpu,cpuacct; a quota of -1 is none.
    root, member = _cgroup(tmp_path / "v1", "4:cpu,cpuacct:/docker/abc\n",
                           {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root, member) == 2.0
    root, member = _cgroup(tmp_path / "v1none", "4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root, member) is None and usable_cpus(root, member) == affinity
    # Inside a container the cgroup path is not under the mount: the mount's own file is read.
    root, member = _cgroup(tmp_path / "ns", "0::/kubepods/pod1/c1\n", {"cpu.max": "400000 100000\n"})
    assert cpu_quota(root, member) == 4.0
    root, member = _cgroup(tmp_path / "none", "", {})
    assert cpu_quota(root, member) is None and usable_cpus(root, member) == affinity
    assert cpu_quota(*_cgroup(tmp_path / "odd", "0::/\n", {"cpu.max": "garbage\n"})) is None  # unreadable: no quota assumed
