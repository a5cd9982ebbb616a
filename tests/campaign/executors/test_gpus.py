"""gpufill.gpus, what the local executor plans its lanes from: the GPUs CUDA would show, read from NVML (a fake here) without torch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpufill import gpus

GIB = 2**30


class FakeNvml:
    """NVML with devices of the given sizes (GiB), in PCI bus order, UUIDs GPU-0000..., GPU-1111..."""

    def __init__(self, sizes: list[int], *, fails: bool = False):
        self.sizes, self.fails = sizes, fails

    def nvmlInit(self) -> None:
        if self.fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.sizes)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.sizes[handle] * GIB)

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{str(handle) * 4}-abcd".encode()


@pytest.fixture
def cuda_build(monkeypatch):
    monkeypatch.setattr(gpus, "torch_has_cuda", lambda: True)


def test_the_installed_cpu_build_of_torch_is_read_as_having_no_cuda_and_plans_no_gpu():
    import torch

    assert gpus.torch_has_cuda() is (torch.version.cuda is not None)
    if torch.version.cuda is None:
        assert gpus.visible_gpu_memory(nvml=FakeNvml([80])) == []  # NVML sees a GPU, a CPU build cannot use it


@pytest.mark.parametrize(("setting", "expected"), [
    (None, [80, 80, 80]),
    ("2,0", [80, 80]),
    ("GPU-1111,2", [80, 80]),  # a UUID prefix, as CUDA accepts it
    ("1,7,2", [80]),  # CUDA stops at the first entry it cannot use
    ("-1", []),
    ("", []),
], ids=["all", "indices", "uuid", "stops-at-unknown", "minus-one", "empty"])
def test_cuda_visible_devices_chooses_and_orders_the_devices(cuda_build, setting, expected):
    environ = {} if setting is None else {"CUDA_VISIBLE_DEVICES": setting}
    assert gpus.visible_gpu_memory(environ, nvml=FakeNvml([80, 80, 80])) == [size * GIB for size in expected]


def test_devices_of_different_sizes_in_cuda_s_own_order_are_left_to_torch(cuda_build):
    assert gpus.visible_gpu_memory({}, nvml=FakeNvml([80, 40])) is None  # CUDA orders fastest first, NVML by bus
    assert gpus.visible_gpu_memory({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, nvml=FakeNvml([80, 40])) == [80 * GIB, 40 * GIB]
    assert gpus.visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "1"}, nvml=FakeNvml([80, 40])) == [40 * GIB]  # one device: no order


def test_mig_instances_and_a_missing_nvml_are_left_to_torch(cuda_build):
    assert gpus.visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "MIG-abcd"}, nvml=FakeNvml([80])) is None
    assert gpus.visible_gpu_memory({}, nvml=FakeNvml([80], fails=True)) is None
