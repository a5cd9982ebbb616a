import threading

import pytest
import torch

import gpufill
from gpufill.monitor import MonitorCallback, NullMonitor, Sampler, TrainingMonitor
from gpufill.monitor.sampler import GpuReading


class ManualClock:
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_summary_arithmetic_on_hand_made_iterations():
    clock = ManualClock()
    monitor = TrainingMonitor(clock=clock).start()
    for i in range(1, 11):  # 0.1 ... 1.0 s, 32 samples each, a tenth of each step waiting for data
        monitor.log_iteration(i / 10, samples=32, data_wait_s=i / 100)
    clock.advance(6.0)
    monitor.stop()
    clock.advance(100.0)  # after stop(): wall time is frozen
    s = monitor.summary()
    assert s["iterations"] == 10 and s["samples"] == 320
    assert s["step_s_mean"] == pytest.approx(0.55)
    assert s["step_s_p50"] == pytest.approx(0.55)  # linear interpolation between 0.5 and 0.6
    assert s["step_s_p95"] == pytest.approx(0.955)  # rank 8.55: 0.9 + 0.55 * 0.1
    assert s["samples_per_s"] == pytest.approx(320 / 5.5)
    assert s["data_wait_share"] == pytest.approx(0.1)
    assert s["wall_s"] == pytest.approx(6.0)
    assert s["gpu_util_mean"] is None  # no sampler


def test_step_context_times_the_block_and_the_data_wait():
    clock = ManualClock()
    monitor = TrainingMonitor(clock=clock)
    for wait, compute in [(0.2, 0.8), (0.0, 1.0), (0.4, 1.6)]:
        with monitor.step(samples=64) as step:
            with step.waiting():
                clock.advance(wait)
            clock.advance(compute)
    s = monitor.summary()
    assert s["iterations"] == 3 and s["samples"] == 192
    assert s["step_s_mean"] == pytest.approx(4.0 / 3) and s["step_s_p50"] == pytest.approx(1.0)
    assert s["data_wait_share"] == pytest.approx(0.6 / 4.0)
    assert s["samples_per_s"] == pytest.approx(48.0)
    assert s["wall_s"] is None  # never started


def test_a_step_that_raises_is_still_logged():
    clock = ManualClock()
    monitor = TrainingMonitor(clock=clock)
    with pytest.raises(RuntimeError), monitor.step(samples=8):
        clock.advance(0.5)
        raise RuntimeError("out of memory")
    assert monitor.summary()["step_s_mean"] == 0.5


def test_empty_summary_has_no_made_up_numbers():
    s = TrainingMonitor(clock=ManualClock()).summary()
    assert s == {"iterations": 0, "samples": 0, "samples_per_s": None, "step_s_mean": None, "step_s_p50": None,
                 "step_s_p95": None, "data_wait_share": None, "gpu_util_mean": None, "wall_s": None}


def test_null_monitor_does_nothing_with_the_same_methods():
    monitor = NullMonitor()
    with monitor:
        monitor.log_iteration(1.0, samples=10, data_wait_s=0.5)
        with monitor.step(samples=10) as step, step.waiting():
            pass
    summary = monitor.summary()
    assert summary["iterations"] == 0 and summary["samples"] == 0 and summary["step_s_mean"] is None
    assert set(summary) == set(TrainingMonitor().summary())
    public = {name for name in dir(TrainingMonitor) if not name.startswith("_")} - {"clock", "sampler"}
    assert public <= set(dir(NullMonitor))


class OneGpu:
    def __init__(self, utils):
        self.utils = iter(utils)

    def count(self):
        return 1

    def read(self, index):
        return GpuReading(index=0, util=next(self.utils), mem_used=1.0, mem_total=2.0, power_w=None,
                          power_limit_w=None, temp_c=None, sm_clock_mhz=None)


def test_gpu_utilisation_comes_from_samples_between_start_and_stop():
    sampler = Sampler(interval=3600.0, gpu_source=OneGpu([99.0, 40.0, 60.0, 80.0]), clock=ManualClock())
    sampler.sample_once()  # before start(): not counted
    first = threading.Event()
    sampler.subscribe(lambda rows: first.set())
    monitor = TrainingMonitor(clock=ManualClock(), sampler=sampler)
    monitor.start()  # starts the (stopped) sampler: its first sample (40 %) is taken at once
    assert sampler.running and first.wait(10)
    sampler.sample_once()  # 60 %, as a campaign driving the sampler would
    monitor.stop()
    assert not sampler.running
    sampler.sample_once()  # 80 %, after stop(): not counted
    assert monitor.summary()["gpu_util_mean"] == pytest.approx(50.0)


def test_a_running_sampler_is_listened_to_not_stopped():
    sampler = Sampler(interval=3600.0, gpu_source=None, clock=ManualClock())
    with sampler:
        with TrainingMonitor(sampler=sampler):
            pass
        assert sampler.running
    assert not sampler.running


def test_monitor_callback_feeds_from_a_real_fit():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, 2, generator=g), torch.randn(96, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 1))
    monitor = TrainingMonitor()
    with monitor:
        result = gpufill.fit(model, (x, y), epochs=3, batch_size=32, callbacks=[MonitorCallback(monitor, samples_per_epoch=96)])
    s = monitor.summary()
    assert s["iterations"] == 3 and s["samples"] == 288
    assert s["step_s_mean"] == pytest.approx(sum(r.seconds for r in result.history) / 3)
    assert s["samples_per_s"] == pytest.approx(288 / sum(r.seconds for r in result.history))
    assert s["wall_s"] >= sum(r.seconds for r in result.history)
