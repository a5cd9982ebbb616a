import math

import pytest
import torch

from gpufill.engine import batching as batching_module
from gpufill.engine import plan as plan_module
from gpufill.errors import InputError
from gpufill.engine.plan import DataFacts, SpeedSettings, lr_scale_factor, make_plan
from tests.fakes import CPU, H100, T4

SMALL = DataFacts(n_train=10_000, bytes_total=10 * 2**20)


@pytest.fixture(autouse=True)
def _plenty_of_free_memory(monkeypatch):
    monkeypatch.setattr(batching_module, "free_memory_bytes", lambda hw: hw.total_memory_bytes)


def test_every_setting_has_a_value_and_a_reason():
    plan = make_plan(H100, SMALL, SpeedSettings())
    for name, choice in plan.to_dict().items():
        assert set(choice) == {"value", "reason"}
        assert len(choice["reason"]) > 5, name


def test_auto_precision_starts_at_fp32_and_names_what_is_timed_against_it():
    h100, t4, cpu = (make_plan(hw, SMALL, SpeedSettings()) for hw in (H100, T4, CPU))
    assert h100.precision.value == "fp32" and "bf16" in h100.precision.reason and "sm_90" in h100.precision.reason
    assert "small models are often faster in fp32" in h100.precision.reason
    assert t4.precision.value == "fp32" and "fp16 with loss scaling" in t4.precision.reason and "sm_75" in t4.precision.reason
    assert cpu.precision.value == "fp32" and cpu.autocast_dtype is None and not cpu.grad_scaler.value
    bf16 = make_plan(H100, SMALL, SpeedSettings(precision="bf16"))
    assert bf16.precision.value == "bf16" and bf16.autocast_dtype is torch.bfloat16 and not bf16.grad_scaler.value
    fp16 = make_plan(T4, SMALL, SpeedSettings(precision="fp16"))
    assert fp16.grad_scaler.value and fp16.autocast_dtype is torch.float16


def test_measured_settings_start_at_torchs_defaults_and_requests_are_kept():
    h100, cpu = make_plan(H100, SMALL, SpeedSettings()), make_plan(CPU, SMALL, SpeedSettings())
    assert not h100.tf32.value and "timed against full fp32" in h100.tf32.reason
    assert not h100.cudnn_benchmark.value and "timed" in h100.cudnn_benchmark.reason
    assert not cpu.tf32.value and not cpu.cudnn_benchmark.value
    assert not h100.step_graph.value and "timed against them" in h100.step_graph.reason
    assert not cpu.step_graph.value and "CUDA" in cpu.step_graph.reason
    assert cpu.threads.value == torch.get_num_threads() and "timed against it" in cpu.threads.reason
    requested = make_plan(H100, SMALL, SpeedSettings(tf32=True, cudnn_benchmark=True, cuda_graph=True, threads=3))
    assert requested.tf32.value and requested.cudnn_benchmark.value and requested.step_graph.value and requested.threads.value == 3


def test_compile_is_measured_unless_requested():
    auto = make_plan(H100, SMALL, SpeedSettings())
    assert auto.compile.value is False and "long enough to repay it" in auto.compile.reason
    assert make_plan(CPU, SMALL, SpeedSettings(compile=True)).compile.value == "default"
    assert make_plan(H100, SMALL, SpeedSettings(compile="reduce-overhead")).compile.value == "reduce-overhead"
    assert make_plan(H100, SMALL, SpeedSettings(compile=False)).compile.reason == "requested: off"


def test_the_probe_is_planned_for_known_lengths_only():
    assert make_plan(CPU, SMALL, SpeedSettings(), epochs=3).probe.reason == "to be measured before the first epoch"
    assert "not given" in make_plan(CPU, SMALL, SpeedSettings()).probe.reason
    stream = DataFacts(n_train=None, bytes_total=0, kind="stream")
    assert "IterableDataset" in make_plan(CPU, stream, SpeedSettings(), epochs=3).probe.reason
    assert "careful hand loop" in make_plan(CPU, SMALL, SpeedSettings(probe=False), epochs=3).probe.reason


@pytest.mark.parametrize(
    ("hardware", "precision", "field_text"),
    [(T4, "bf16", "compute capability 8.0"), (CPU, "fp16", "no fast CPU kernels")],
)
def test_impossible_precision_is_a_clear_error(hardware, precision, field_text):
    with pytest.raises(InputError) as error:
        make_plan(hardware, SMALL, SpeedSettings(precision=precision))
    message = str(error.value)
    assert "precision" in message and field_text in message and "fix:" in message


def test_small_data_is_resident_large_data_streams(monkeypatch):
    assert make_plan(H100, SMALL, SpeedSettings()).data_placement.value == "device"
    huge = DataFacts(n_train=10_000, bytes_total=40 * 2**30)  # > 25 % of 80 GiB
    plan = make_plan(H100, huge, SpeedSettings())
    assert plan.data_placement.value == "loader"
    loader = plan.loader.value
    assert loader.num_workers == 8 and loader.pin_memory and loader.persistent_workers and loader.prefetch_factor == 4
    dataset = DataFacts(n_train=100, bytes_total=0, kind="dataset")
    cpu_plan = make_plan(CPU, dataset, SpeedSettings())
    assert cpu_plan.data_placement.value == "loader"
    assert cpu_plan.loader.value.num_workers == 0 and not cpu_plan.loader.value.pin_memory
    with pytest.raises(InputError, match="data_placement"):
        make_plan(CPU, dataset, SpeedSettings(data_placement="device"))


def test_batching_keeps_the_effective_batch_through_accumulation():
    plan = make_plan(CPU, SMALL, SpeedSettings(batch_size=128, micro_batch=32))
    assert (plan.effective_batch.value, plan.micro_batch.value, plan.accumulation.value) == (128, 32, 4)
    odd = make_plan(CPU, SMALL, SpeedSettings(batch_size=100, micro_batch=32))
    assert odd.accumulation.value == 4  # 32 + 32 + 32 + 4
    auto = make_plan(CPU, SMALL, SpeedSettings())
    assert auto.effective_batch.value == 128 and auto.accumulation.value == 1
    tiny = make_plan(CPU, DataFacts(n_train=100, bytes_total=1), SpeedSettings())
    assert tiny.effective_batch.value == 16  # largest power of two with >= 4 steps per epoch
    with pytest.raises(InputError, match="micro_batch"):
        make_plan(CPU, SMALL, SpeedSettings(batch_size=64, micro_batch=128))
    with pytest.raises(InputError, match="batch_size"):
        make_plan(CPU, SMALL, SpeedSettings(batch_size=0))


def test_lr_scale_arithmetic():
    assert lr_scale_factor(512, 128, "linear") == 4.0
    assert lr_scale_factor(512, 128, "sqrt") == 2.0
    assert lr_scale_factor(32, 128, "linear") == 0.25
    assert lr_scale_factor(512, 128, "none") == 1.0
    linear = make_plan(CPU, SMALL, SpeedSettings(batch_size=512, reference_batch=128))
    assert linear.lr_scale.value == 4.0 and "linear" in linear.lr_scale.reason
    root = make_plan(CPU, SMALL, SpeedSettings(batch_size=512, reference_batch=128, lr_scale_rule="sqrt"))
    assert math.isclose(root.lr_scale.value, 2.0)
    same = make_plan(CPU, SMALL, SpeedSettings(batch_size=512))  # reference defaults to the requested batch
    assert same.lr_scale.value == 1.0
    with pytest.raises(InputError, match="lr_scale_rule"):
        make_plan(CPU, SMALL, SpeedSettings(batch_size=512, reference_batch=128, lr_scale_rule="cubic"))


def test_optimizer_kernel_and_step_sync_are_plan_settings():
    auto = make_plan(CPU, SMALL, SpeedSettings())
    assert auto.step_sync.value is False and "once per epoch" in auto.step_sync.reason
    forced = make_plan(CPU, SMALL, SpeedSettings(optimizer_kernel="for-loop", sync_every_step=True))
    assert forced.optimizer_kernel.value == "for-loop" and forced.optimizer_kernel.reason == "requested"
    assert forced.step_sync.value is True
    with pytest.raises(InputError, match="optimizer_kernel"):
        make_plan(CPU, SMALL, SpeedSettings(optimizer_kernel="bogus"))  # type: ignore[arg-type]


def test_host_memory_is_kept_on_a_glibc_cpu_only(monkeypatch):
    for name in (*plan_module._MALLOC_VARIABLES, "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    cpu, h100 = make_plan(CPU, SMALL, SpeedSettings()), make_plan(H100, SMALL, SpeedSettings())
    assert not h100.host_memory.value and "caching allocator" in h100.host_memory.reason
    assert cpu.host_memory.value is plan_module._glibc()
    if cpu.host_memory.value:
        assert "32 MiB" in cpu.host_memory.reason and "page-faulting" in cpu.host_memory.reason
    monkeypatch.setattr(plan_module, "_glibc", lambda: True)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")  # the user's own malloc setting is kept
    users = make_plan(CPU, SMALL, SpeedSettings()).host_memory
    assert not users.value and "MALLOC_TRIM_THRESHOLD_" in users.reason and "kept as given" in users.reason
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert not make_plan(CPU, SMALL, SpeedSettings()).host_memory.value
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert make_plan(CPU, SMALL, SpeedSettings()).host_memory.value
    monkeypatch.setattr(plan_module, "_glibc", lambda: False)
    other_libc = make_plan(CPU, SMALL, SpeedSettings()).host_memory
    assert not other_libc.value and "not glibc" in other_libc.reason


_FAULTS = """
import ctypes, resource, sys, torch
from gpufill.engine.backend import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, one fault each (transparent huge pages would merge them)
if sys.argv[1] == "keep":
    assert keep_freed_memory()
else:  # glibc's starting thresholds (128 KiB), whatever blocks importing torch happened to free (they move them)
    assert libc.mallopt(M_MMAP_THRESHOLD, 128 << 10) and libc.mallopt(M_TRIM_THRESHOLD, 128 << 10)
def step():  # a step's activations: six 4 MiB blocks, all freed at its end
    blocks = [torch.empty(1 << 20).fill_(1.0) for _ in range(6)]
    return float(sum(b[0] for b in blocks))
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
def test_kept_host_memory_ends_the_page_faults_of_each_step():
    """The reason host_memory gives, measured: a step's 4 MiB blocks, freed and allocated again, fault every page in
    each step from glibc's starting thresholds (each block mapped afresh), and not once freed memory is kept (a fresh
    process each: the setting lasts for the process)."""
    import subprocess
    import sys

    if not plan_module._glibc():
        pytest.skip("not glibc: the setting is not made")
    faults = {mode: int(subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True, timeout=300).stdout)
              for mode in ("default", "keep")}
    assert faults["default"] > 50 * 1024  # at least a block's pages (1,024 of 4 KiB) faulted in again every step
    assert faults["keep"] < faults["default"] / 20
