"""gpufill doctor: the verdict rules on constructed numbers, the real profiler on constructed trainings, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpufill.doctor import (
    PhaseTimings,
    Yardstick,
    classify,
    diagnose,
    profile_training,
    speedtest,
)
from gpufill.doctor.environment import check_environment, check_variables, load_check
from gpufill.doctor.profiler import typical_step
from gpufill.doctor.report import yardstick
from gpufill.doctor.speedtest import (
    Rate,
    SpeedTest,
    SpeedTestSizes,
    precisions,
    run_speed_test,
)
from gpufill.errors import InputError
from gpufill.engine.hardware import detect
from tests import fakes
from tests.helpers import run_cli

KINDS = {"input-bound", "launch/overhead-bound", "compute-bound", "memory-bound"}
TINY_SPEED_TEST = SpeedTestSizes(matmul_n=128, copy_bytes=2**20, reps=2)


def timings(**overrides) -> PhaseTimings:
    """A step that scales with the batch and spends little on input; overrides make each case."""
    values = {"data_s": 0.0005, "copy_s": 0.0005, "forward_s": 0.004, "backward_s": 0.005, "optimizer_s": 0.001,
              "batch_size": 128, "steps": 20, "compute_b_s": 0.01, "compute_2b_s": 0.019, "flops_per_step": None}
    return PhaseTimings(**{**values, **overrides})


CPU_YARDSTICK = Yardstick(device_type="cpu", cpu_count=2, matmul_tflops=2.0, memory_gbps=100.0,
                          data_bytes=2**20, free_bytes=10 * 2**30)
H100_YARDSTICK = Yardstick(device_type="cuda", cpu_count=16, matmul_tflops=50.0, memory_gbps=3000.0, fast_precision="bf16",
                           fast_matmul_ratio=10.0, fast_ratio_source="measured", data_bytes=2**20, free_bytes=70 * 2**30)


# --- the classifier, on constructed numbers -----------------------------------------------------


def test_shares_sum_to_one_and_name_every_phase():
    t = timings()
    assert set(t.shares) == {"data_wait", "copy", "forward", "backward", "optimizer"}
    assert math.isclose(sum(t.shares.values()), 1.0)
    assert math.isclose(t.step_s, 0.011)
    assert math.isclose(t.input_share, 1 / 11)


def test_achieved_flops_use_the_less_disturbed_of_the_two_compute_timings():
    assert timings(flops_per_step=1e10).achieved_tflops == pytest.approx(1.0)  # both 10 ms
    assert timings(flops_per_step=1e10, compute_b_s=0.02).achieved_tflops == pytest.approx(1.0)  # the phases' 10 ms
    assert timings(flops_per_step=1e10, compute_b_s=0.005).achieved_tflops == pytest.approx(2.0)  # the probe's 5 ms


def test_input_bound_gain_is_the_step_over_its_compute_and_small_data_goes_on_the_device():
    verdict = classify(timings(data_s=0.006, copy_s=0.001, forward_s=0.003, backward_s=0.004, optimizer_s=0.001), CPU_YARDSTICK)
    assert verdict.kind == "input-bound"
    assert verdict.evidence["input_share"] == pytest.approx(7 / 15)
    assert verdict.expected_gain == pytest.approx(1 / (1 - 7 / 15))  # 1.875x
    assert "1.88x" in verdict.expected_gain_reason
    assert "put the data on the device" in verdict.fix and "25%" in verdict.fix


def test_input_bound_with_data_too_big_for_the_device_raises_the_loader_workers():
    big = Yardstick(device_type="cpu", cpu_count=8, matmul_tflops=2.0, memory_gbps=100.0, data_bytes=4 * 2**30, free_bytes=10 * 2**30)
    verdict = classify(timings(data_s=0.02), big)
    assert verdict.kind == "input-bound"
    assert "num_workers to 7" in verdict.fix  # one of the 8 cores stays with the training loop


def test_overhead_bound_when_doubling_the_batch_barely_costs_time():
    verdict = classify(timings(compute_b_s=0.010, compute_2b_s=0.011), H100_YARDSTICK)
    assert verdict.kind == "launch/overhead-bound"
    assert verdict.evidence["scaling_2b_over_b"] == pytest.approx(1.1)
    assert verdict.expected_gain == pytest.approx(2 / 1.1)
    assert "micro-batch" in verdict.fix and "pack" in verdict.fix and "CUDA graphs" in verdict.fix


def test_without_the_batch_probe_the_roofline_finds_a_fixed_cost():
    # A script's own batch: no t(2b). 10 ms of compute; FLOPs worth 0.5 ms and bytes worth 1.5 ms at the measured rates.
    script = dict(compute_2b_s=None, flops_per_step=0.0005 * 50e12, bytes_per_step=0.0015 * 3000e9, ops_per_step=400)
    verdict = classify(timings(**script), H100_YARDSTICK)
    assert verdict.kind == "launch/overhead-bound"
    assert verdict.evidence["flops_share_of_compute"] == pytest.approx(0.05)
    assert verdict.evidence["bytes_share_of_compute"] == pytest.approx(0.15)
    assert verdict.expected_gain == pytest.approx(2 / 1.2)  # twice the batch adds at most the explained 5 + 15 %
    assert "400 operators, 25.0 us each" in verdict.reason and "1.20x the time" in verdict.reason
    assert "estimated from the roofline" in verdict.expected_gain_reason
    # FLOPs and bytes explaining 10 + 20 % together reach the threshold: not overhead-bound (memory-bound by the FLOP share).
    assert classify(timings(**{**script, "flops_per_step": 0.001 * 50e12, "bytes_per_step": 0.002 * 3000e9}), H100_YARDSTICK).kind == "memory-bound"
    # A measured probe outranks the roofline: scaling 1.9 with the same counts is not overhead-bound.
    assert classify(timings(**{**script, "compute_2b_s": 0.019}), H100_YARDSTICK).kind == "memory-bound"
    # Without a byte count the roofline is not used (the old rule: FLOP share 5 % -> memory-bound).
    assert classify(timings(**{**script, "bytes_per_step": None}), H100_YARDSTICK).kind == "memory-bound"
    # FLOPs worth 5 ms at the fp32 rate are compute-bound; run in bf16 (10x the rate here) they are 0.5 ms: a fixed cost.
    heavy = {**script, "flops_per_step": 0.005 * 50e12}
    assert classify(timings(**heavy), H100_YARDSTICK).kind == "compute-bound"
    assert classify(timings(**heavy, fast_matmuls=True), H100_YARDSTICK).kind == "launch/overhead-bound"


def test_input_share_wins_over_overhead():
    verdict = classify(timings(data_s=0.05, compute_2b_s=0.0101), CPU_YARDSTICK)
    assert verdict.kind == "input-bound"


def test_compute_bound_on_a_gpu_gains_by_amdahl_over_the_precision_ratio():
    # 2.5e11 FLOPs in 10 ms = 25 TFLOP/s = half the measured 50 TFLOP/s matmul rate.
    verdict = classify(timings(flops_per_step=2.5e11), H100_YARDSTICK)
    assert verdict.kind == "compute-bound"
    assert verdict.evidence["achieved_tflops"] == pytest.approx(25.0)
    assert verdict.evidence["matmul_share"] == pytest.approx(0.5)
    assert verdict.expected_gain == pytest.approx(1 / (0.5 / 10 + 0.5 / 2))  # 3.33x
    assert "bf16" in verdict.fix


def test_memory_bound_on_a_gpu_gains_about_the_halved_bytes():
    verdict = classify(timings(flops_per_step=5e10), H100_YARDSTICK)  # 5 TFLOP/s = 10 % of the matmul rate
    assert verdict.kind == "memory-bound"
    assert verdict.evidence["matmul_share"] == pytest.approx(0.1)
    assert verdict.expected_gain == pytest.approx(1 / (0.1 / 10 + 0.9 / 2))  # 2.17x
    assert "halves the bytes" in verdict.fix


def test_compute_bound_on_the_cpu_points_to_a_gpu_with_the_reference_gpus_ratios():
    verdict = classify(timings(flops_per_step=1e10), CPU_YARDSTICK)  # 1 TFLOP/s of a 2 TFLOP/s CPU
    assert verdict.kind == "compute-bound"
    flops_ratio, bytes_ratio = 8.1 / 2.0, 320 / 100.0  # T4 peaks over the measured rates
    assert verdict.expected_gain == pytest.approx(1 / (0.5 / flops_ratio + 0.5 / bytes_ratio))
    assert "a GPU" in verdict.fix and "T4" in verdict.expected_gain_reason


def test_cpu_gain_is_capped_where_the_gpus_ratios_are_huge():
    slow_cpu = Yardstick(device_type="cpu", cpu_count=2, matmul_tflops=0.05, memory_gbps=5.0)
    verdict = classify(timings(flops_per_step=2.5e8), slow_cpu)
    assert verdict.kind == "compute-bound"
    assert verdict.expected_gain == 10.0


def test_on_a_cpu_the_share_is_taken_against_the_matmul_timed_in_the_probes_rounds():
    """A loaded CI run: the speed test caught a quiet second (2.0 TFLOP/s), the probe a busy one. The yardstick's
    matmul timed in the probe's rounds saw the same load (0.5), so the verdict stays compute-bound."""
    busy = timings(flops_per_step=5e9, compute_b_s=0.02, compute_2b_s=0.038, forward_s=0.008, backward_s=0.01, optimizer_s=0.002)  # 0.25 TFLOP/s
    assert classify(busy, CPU_YARDSTICK).kind == "memory-bound"  # 12.5 % of the speed test's rate
    verdict = classify(dataclasses.replace(busy, matmul_beside_tflops=0.5), CPU_YARDSTICK)
    assert verdict.kind == "compute-bound"
    assert verdict.evidence["matmul_share"] == pytest.approx(0.5) and verdict.evidence["matmul_beside_probe_tflops"] == 0.5
    assert "0.25 TFLOP/s achieved in the probe = 50% of the 0.5 TFLOP/s fp32 matmul rate timed in its rounds" in verdict.reason


def test_without_a_flop_count_it_assumes_compute_bound_and_says_so():
    verdict = classify(timings(flops_per_step=None), H100_YARDSTICK)
    assert verdict.kind == "compute-bound"
    assert "assumed" in verdict.reason
    assert verdict.expected_gain == pytest.approx(1 / (0.3 / 10 + 0.7 / 2))


def test_a_batch_that_did_not_fit_twice_skips_the_scaling_rule():
    verdict = classify(timings(compute_2b_s=None, flops_per_step=2.5e11), H100_YARDSTICK)
    assert verdict.kind == "compute-bound"
    assert verdict.evidence["scaling_2b_over_b"] is None
    assert "did not fit" in verdict.reason


def test_verdict_to_dict_has_the_contract_keys():
    record = classify(timings(flops_per_step=2.5e11), H100_YARDSTICK).to_dict()
    assert {"kind", "evidence", "fix", "expected_gain", "expected_gain_reason"} <= set(record)
    assert record["expected_gain"] == 3.33
    json.dumps(record)


# --- the real profiler on this machine ------------------------------------------------------------


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared 2-core machine, two OpenMP threads spin at every op's
    barrier whenever another process holds a core, which makes timings erratic; one thread
    time-shares evenly (the autouse hygiene fixture restores the count)."""
    torch.set_num_threads(1)


class SlowDataset(Dataset):
    """Each sample costs 2 ms of waiting, as a dataset that reads files or decodes would."""

    def __init__(self, n: int = 256):
        self.x, self.y = torch.randn(n, 8), torch.randn(n, 1)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, index: int):
        time.sleep(0.002)
        return self.x[index], self.y[index]


def test_a_slow_dataset_with_a_tiny_model_is_input_bound(one_thread):
    report = diagnose(nn.Linear(8, 1), SlowDataset(), batch_size=16, steps=5, device="cpu", speed_sizes=TINY_SPEED_TEST)
    assert report.verdict.kind == "input-bound", report.verdict.reason
    assert report.timings.data_s >= 16 * 0.002  # at least the sleeps
    assert report.timings.input_share > 0.6
    assert "num_workers to 1" in report.verdict.fix  # 2 cores: one stays with the loop
    assert report.verdict.expected_gain == pytest.approx(1 / (1 - report.timings.input_share))


@pytest.mark.serial  # measures time: matmul share and thread scaling from timings
@pytest.mark.slow
def test_a_wide_mlp_on_tensors_is_compute_bound(one_thread):
    torch.manual_seed(0)
    width = 1024
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    data = (torch.randn(1024, width), torch.randn(1024, width))
    report = diagnose(model, data, batch_size=256, steps=4, device="cpu")
    t = report.timings
    assert report.verdict.kind == "compute-bound", report.verdict.reason
    # FlopCounterMode: forward 3 matmuls, backward 3 weight grads + 2 input grads (the input needs none).
    assert t.flops_per_step == pytest.approx(8 * 2 * 256 * width * width)
    assert report.verdict.evidence["matmul_share"] >= 0.3 and t.scaling is not None and t.scaling >= 1.3
    # The yardstick's matmul was timed again in the probe's rounds (a CPU), and the share is taken against it.
    assert t.matmul_beside_tflops is not None and report.verdict.evidence["matmul_share"] == pytest.approx(
        t.flops_per_step / t.compute_b_s / 1e12 / t.matmul_beside_tflops)
    assert report.data_bytes == 2 * 1024 * width * 4


def test_profiling_leaves_the_callers_model_untouched_and_counts_recurrent_flops(one_thread):
    torch.manual_seed(0)
    model = nn.LSTM(3, 16, batch_first=True)

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = model, nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    wrapped = Last()
    before = [p.detach().clone() for p in wrapped.parameters()]
    loader = DataLoader(list(zip(torch.randn(64, 10, 3), torch.randn(64, 1), strict=True)), batch_size=32, shuffle=True)
    t = profile_training(wrapped, loader, batch_size=32, steps=3)
    assert all(torch.equal(a, b) for a, b in zip(before, wrapped.parameters(), strict=True))
    # The LSTM's matmuls are counted (oneDNN's fused kernel is switched off while counting):
    # forward 10 steps x 2 x 32 x (3 + 16) x 64, the head, and about twice that backward.
    lstm_forward = 10 * 2 * 32 * (3 + 16) * 4 * 16
    assert t.flops_per_step is not None and t.flops_per_step > 2.5 * lstm_forward
    assert t.batch_size == 32 and t.steps == 3
    assert t.syncs_per_step is None  # not measurable on the CPU


def test_typical_step_drops_disturbed_compute_but_keeps_every_data_wait():
    # Five steps: data wait, copy, forward, backward, optimizer. Step 3 was disturbed (slow forward);
    # steps 1 and 4 waited for a loader worker. The disturbed step goes, the waits stay.
    laps = [[0.0, 0.0, 1.0, 1.0, 0.0], [5.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 9.0, 1.0, 0.0],
            [5.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0]]
    assert typical_step(laps) == pytest.approx([2.5, 0.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize(
    ("data", "match"),
    [([1, 2, 3], "takes \\(inputs, targets\\) batches, but a batch is a Tensor"), (object(), "expected tensors"),
         ((torch.zeros(0, 2), torch.zeros(0, 1)), "no samples")],
)
def test_unusable_data_is_an_input_error(data, match):
    if isinstance(data, list):
        data = DataLoader(data, batch_size=2)
    with pytest.raises(InputError, match=match):
        profile_training(nn.Linear(2, 1), data, batch_size=2, steps=1)


# --- speed test -----------------------------------------------------------------------------------------


def test_cpu_speed_test_reports_measured_rates_and_no_peak():
    speed = run_speed_test(fakes.CPU, TINY_SPEED_TEST)
    assert [rate.name for rate in speed.matmul] == ["fp32"]
    assert speed.matmul[0].value > 0 and speed.memory.value > 0
    record = speed.to_dict()
    assert record["matmul_tflops"]["fp32"]["ratio_to_peak"] == "n/a"
    assert record["memory_gbps"]["peak"] == "n/a"


def test_speed_test_arithmetic_counts_2n3_flops_and_read_plus_write_bytes(monkeypatch):
    monkeypatch.setattr(speedtest, "best_seconds", lambda work, device, reps: 0.001)
    speed = run_speed_test(fakes.CPU, SpeedTestSizes(matmul_n=128, copy_bytes=2**20, reps=1))
    assert speed.matmul_tflops("fp32") == pytest.approx(2 * 128**3 / 0.001 / 1e12)
    assert speed.memory.value == pytest.approx(2 * 2**20 / 0.001 / 1e9)
    assert speed.matmul_tflops("bf16") is None


def test_gpu_precisions_and_peaks_come_from_the_table():
    assert [(name, peak) for name, _dtype, _tf32, peak in precisions(fakes.H100)] == [("fp32", 66.9), ("tf32", 494.7), ("bf16", 989.5)]
    assert [name for name, *_ in precisions(fakes.T4)] == ["fp32"]  # no TF32 or bf16 before sm_80


def _speed(device: str, **rates: float) -> SpeedTest:
    matmul = tuple(Rate(name=name, value=value, unit="TFLOP/s", peak=None, detail="") for name, value in rates.items())
    return SpeedTest(device=device, matmul=matmul, memory=Rate(name="copy", value=1000.0, unit="GB/s", peak=None, detail=""), seconds=1.0)


def test_yardstick_uses_the_measured_bf16_ratio_else_the_datasheet_fp16_ratio():
    h100 = yardstick(fakes.H100, _speed("cuda:0", fp32=50.0, tf32=300.0, bf16=600.0), data_bytes=None, free_bytes=None)
    assert (h100.fast_precision, h100.fast_matmul_ratio) == ("bf16", 12.0)
    assert h100.fast_ratio_source == "measured by the speed test"
    t4 = yardstick(fakes.T4, _speed("cuda:0", fp32=7.0), data_bytes=None, free_bytes=None)
    assert t4.fast_precision == "fp16" and t4.fast_matmul_ratio == pytest.approx(65 / 8.1)
    cpu = yardstick(fakes.CPU, _speed("cpu", fp32=0.1), data_bytes=10, free_bytes=100)
    assert cpu.fast_precision is None and cpu.matmul_tflops == 0.1


# --- environment ----------------------------------------------------------------------------------------


def _by_name(checks):
    return {check.name: check for check in checks}


def test_cuda_launch_blocking_warns(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    checks = _by_name(check_environment(detect("cpu")))
    assert checks["CUDA_LAUNCH_BLOCKING"].status == "warn" and "waits" in checks["CUDA_LAUNCH_BLOCKING"].note
    assert checks["OMP_NUM_THREADS"].status == "warn"
    assert checks["MKL_NUM_THREADS"].value == "unset" and checks["MKL_NUM_THREADS"].status == "info"
    assert checks["CPU cores"].value == str(detect("cpu").cpu_count)


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [("CUDA_LAUNCH_BLOCKING", "0", "info"), ("OMP_NUM_THREADS", "2", "ok"), ("OMP_NUM_THREADS", "3", "warn"),
     ("MKL_NUM_THREADS", "many", "warn"), ("CUDA_VISIBLE_DEVICES", "", "warn"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "info")],
)
def test_variables_against_two_cores(name, value, status):
    assert _by_name(check_variables({name: value}, cores=2))[name].status == status


def test_host_load_above_the_cpus_warns():
    assert load_check(5.4, 2).status == "warn"
    assert "set_num_threads(1)" in load_check(5.4, 2, threads=2).note
    assert "set_num_threads" not in load_check(5.4, 2, threads=1).note
    assert load_check(0.5, 2, threads=2).status == "ok"


def _nvml(count=1, init_error=None):
    def init():
        if init_error:
            raise init_error

    return SimpleNamespace(nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count, NVMLError=RuntimeError,
                           nvmlDeviceGetHandleByIndex=lambda i: i, nvmlSystemGetDriverVersion=lambda: b"550.54.15")


def test_gpu_facts_with_nvml_read_driver_capability_and_attention_kernels():
    checks = _by_name(check_environment(fakes.H100, environ={}, nvml=_nvml()))
    assert checks["NVML / driver"].value == "550.54.15" and checks["NVML / driver"].status == "ok"
    assert checks["compute capability"].value == "sm_90 (9.0)" and "H100 SXM" in checks["compute capability"].note
    assert checks["bf16"].status == "ok" and checks["TF32"].status == "ok"
    if torch.backends.cuda.flash_sdp_enabled():
        assert checks["SDPA flash"].value == "available"


def test_an_old_gpu_without_nvml_explains_what_it_lacks():
    checks = _by_name(check_environment(fakes.T4, environ={}, nvml=_nvml(init_error=RuntimeError("Driver Not Loaded"))))
    assert checks["NVML / driver"].status == "warn" and "nvidia-ml-py" in checks["NVML / driver"].note
    assert checks["SDPA flash"].value == "unavailable" and "sm_80" in checks["SDPA flash"].note
    assert checks["bf16"].value == "not supported" and "fp16" in checks["bf16"].note


# --- the command ------------------------------------------------------------------------------------------


def test_doctor_json_on_this_machine(capsys):
    code, out, _err = run_cli(capsys, "doctor", "--json", "--steps", "3", "--device", "cpu")
    assert code == 0
    record = json.loads(out)
    assert {"environment", "speed_test", "training", "verdict"} <= set(record)
    assert 0.005 < record["speed_test"]["matmul_tflops"]["fp32"]["value"] < 5
    assert 0.5 < record["speed_test"]["memory_gbps"]["value"] < 500
    training = record["training"]
    assert sum(training["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert training["steps"] == 3 and training["batch_size"] == 128
    assert training["flops_per_step"] > 0 and training["scaling"]["compute_2b_s"] > 0
    assert record["verdict"]["kind"] in KINDS
    assert record["verdict"]["expected_gain"] >= 1.0
    assert {check["name"] for check in record["environment"]} >= {"python", "torch", "CUDA_LAUNCH_BLOCKING", "torch threads"}


def test_doctor_prints_tables_and_the_verdict(capsys):
    code, out, _err = run_cli(capsys, "doctor", "--model", "mlp", "--steps", "2", "--batch-size", "32", "--device", "cpu")
    assert code == 0
    for heading in ("Environment", "Speed test", "One training step", "data wait", "Verdict:", "Fix:", "Expected gain:"):
        assert heading in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "lstmm"], "unknown model family 'lstmm' (did you mean 'lstm'?)"),
        (["--model", "linear"], "classical family"),
        (["--model", "nosuchpkg.models:make"], "cannot import module"),
        (["--data", "missing.csv"], "no such file"),
        (["--batch-size", "0"], "--batch-size: must be a positive integer"),
        (["--steps", "-1"], "--steps: must be a positive integer"),
        (["--lookback", "0"], "--lookback: must be a positive integer"),
        (["--device", "gpu7"], "unknown device"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(capsys, args, message):
    code, out, err = run_cli(capsys, "doctor", *args)
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_gpu_without_one_is_bad_input(capsys):
    code, _out, err = run_cli(capsys, "doctor", "--device", "cuda")
    assert code == 2 and "no CUDA GPU is visible" in err


# --- on a GPU -----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_speed_test_measures_faster_reduced_precisions():
    hardware = detect("cuda")
    speed = run_speed_test(hardware)
    fp32 = speed.matmul_tflops("fp32")
    assert fp32 is not None and fp32 > 1.0
    if hardware.bf16_supported:
        assert speed.matmul_tflops("bf16") > 2 * fp32
    if hardware.peak is not None:
        assert 0.1 < speed.memory.ratio < 1.2


@pytest.mark.gpu
def test_gpu_profile_counts_the_implicit_syncs_of_item():
    class Syncing(nn.Linear):
        def forward(self, x):
            out = super().forward(x)
            _ = out.sum().item()  # a host read inside the step: one sync
            return out

    data = (torch.randn(256, 64), torch.randn(256, 64))
    t = profile_training(Syncing(64, 64), data, batch_size=64, steps=4, device="cuda")
    assert t.syncs_per_step is not None and t.syncs_per_step >= 1
    assert t.copy_s > 0
