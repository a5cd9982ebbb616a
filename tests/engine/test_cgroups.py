"""cgroup files that are odd (issue 37, item 12): never a crash, and v1 and v2 read alike.

A quota of 400 digits (OverflowError in the division), a cgroup path that is not UTF-8 (UnicodeDecodeError), a zero or
negative v2 quota (taken as one core before, while v1 took it as no limit): each is no limit now, in both versions."""

from __future__ import annotations

import os

import pytest

from gpufill.cpus import cpu_quota, usable_cpus

AFFINITY = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cgroup(tmp_path, membership: bytes, files: dict[bytes, str]):
    root = tmp_path / "cgroup"
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = os.path.join(os.fsencode(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    (tmp_path / "self-cgroup").write_bytes(membership)
    return root, tmp_path / "self-cgroup"


@pytest.mark.parametrize("quota", ["0", "-1", "-100000"])
def test_a_zero_or_negative_quota_is_no_limit_in_v1_and_v2_alike(tmp_path, quota):
    v2 = cgroup(tmp_path / "v2", b"0::/job\n", {b"job/cpu.max": f"{quota} 100000\n"})
    v1 = cgroup(tmp_path / "v1", b"4:cpu,cpuacct:/job\n", {b"cpu,cpuacct/job/cpu.cfs_quota_us": f"{quota}\n",
                                                           b"cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"})
    for root, member in (v2, v1):
        assert cpu_quota(root, member) is None and usable_cpus(root, member) == AFFINITY


@pytest.mark.parametrize("period", ["0", "-5"])
def test_a_zero_or_negative_period_is_no_limit_in_v1_and_v2_alike(tmp_path, period):
    v2 = cgroup(tmp_path / "v2", b"0::/job\n", {b"job/cpu.max": f"200000 {period}\n"})
    v1 = cgroup(tmp_path / "v1", b"4:cpu:/job\n", {b"cpu/job/cpu.cfs_quota_us": "200000\n", b"cpu/job/cpu.cfs_period_us": f"{period}\n"})
    for root, member in (v2, v1):
        assert cpu_quota(root, member) is None and usable_cpus(root, member) == AFFINITY


def test_a_quota_of_400_digits_is_no_limit(tmp_path):
    huge = "9" * 400
    v2 = cgroup(tmp_path / "v2", b"0::/job\n", {b"job/cpu.max": f"{huge} 100000\n"})
    v1 = cgroup(tmp_path / "v1", b"4:cpu:/job\n", {b"cpu/job/cpu.cfs_quota_us": f"{huge}\n", b"cpu/job/cpu.cfs_period_us": "100000\n"})
    for root, member in (v2, v1):
        assert cpu_quota(root, member) is None and usable_cpus(root, member) == AFFINITY
    # A 400-digit period under a real quota is a tiny quota, not a crash: one core.
    tiny = cgroup(tmp_path / "tiny", b"0::/job\n", {b"job/cpu.max": f"100000 {huge}\n"})
    assert usable_cpus(*tiny) == 1


def test_a_cgroup_path_that_is_not_utf8_is_read_and_its_quota_found(tmp_path):
    name = b"job-\xff\xfe"  # a name the kernel allows and UTF-8 does not
    root, member = cgroup(tmp_path, b"0::/" + name + b"\n", {name + b"/cpu.max": "150000 100000\n", b"cpu.max": "max 100000\n"})
    assert cpu_quota(root, member) == 1.5 and usable_cpus(root, member) == min(AFFINITY, 2)
    root, member = cgroup(tmp_path / "v1", b"4:cpu:/" + name + b"\n", {b"cpu/" + name + b"/cpu.cfs_quota_us": "300000\n",
                                                                      b"cpu/" + name + b"/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root, member) == 3.0


def test_a_quota_file_that_is_not_utf8_is_no_limit(tmp_path):
    root, member = cgroup(tmp_path, b"0::/job\n", {b"job/cpu.max": "max"})
    (root / "job" / "cpu.max").write_bytes(b"\xff\xfe 100000\n")
    assert cpu_quota(root, member) is None
