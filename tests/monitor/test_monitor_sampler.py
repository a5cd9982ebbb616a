import csv
import json
import logging
import os
import threading
from types import SimpleNamespace

import psutil
import pytest

from gpufill.campaign.store.store import Store
from gpufill.monitor import sampler as sampler_module
from gpufill.monitor.sampler import (
    SAMPLE_COLUMNS, CsvSink, GpuReading, JsonlSink, NvmlSource, QueueSink, Sampler, decode_throttle, open_gpu_source,
)

GIB = 2**30


class FakeGpus:
    """Two GPUs; gpu1 is thermally throttled and power capped."""

    def __init__(self):
        self.reads = 0

    def count(self):
        return 2

    def read(self, index):
        self.reads += 1
        return GpuReading(index=index, util=[85.0, 12.0][index], mem_used=[10 * GIB, 70 * GIB][index], mem_total=80 * GIB,
                          power_w=[300.0, 150.5][index], power_limit_w=700.0, temp_c=[60.0, 88.0][index],
                          sm_clock_mhz=[1980.0, 1200.0][index], throttle=decode_throttle([0x0, 0x20 | 0x4][index]))


class FakeClock:
    def __init__(self, start=1000.0, step=1.0):
        self.now, self.step = start, step

    def __call__(self):
        value = self.now
        self.now += self.step
        return value


def make_sampler(sink=None, clock=None, **kwargs):
    return Sampler(interval=1.0, gpu_source=FakeGpus(), pids=lambda: [os.getpid()], sink=sink, clock=clock or FakeClock(), **kwargs)


def test_sample_columns_match_the_store():
    assert SAMPLE_COLUMNS == Store.SAMPLE_COLUMNS


@pytest.mark.parametrize("mask, names", [
    (0, ()), (None, ()), (0x20, ("thermal",)), (0x4 | 0x8, ("power_cap", "hw_slowdown")),
    (0x1 | 0x40 | 0x80, ("idle", "hw_thermal", "hw_power_brake")),
])
def test_throttle_bitmask_decoding(mask, names):
    assert decode_throttle(mask) == names


def test_rows_from_a_fake_gpu_source_with_an_injected_clock():
    sink = QueueSink()
    s = make_sampler(sink)
    first = s.sample_once()
    second = s.sample_once()
    assert [r["source"] for r in first] == ["gpu0", "gpu1", "host"]
    assert all(set(r) == set(SAMPLE_COLUMNS) for r in first + second)
    assert {r["ts"] for r in first} == {1000.0} and {r["ts"] for r in second} == {1001.0}
    gpu0, gpu1, host = first
    assert gpu0 == {**dict.fromkeys(SAMPLE_COLUMNS), "ts": 1000.0, "source": "gpu0", "gpu_util": 85.0, "mem_used": 10 * GIB,
                    "mem_total": 80 * GIB, "power_w": 300.0, "power_limit_w": 700.0, "temp_c": 60.0, "sm_clock_mhz": 1980.0,
                    "throttle": []}
    assert gpu1["throttle"] == ["power_cap", "thermal"] and gpu1["gpu_util"] == 12.0 and gpu1["power_w"] == 150.5
    assert gpu1["cpu_percent"] is None and host["gpu_util"] is None and host["throttle"] is None
    # workers_rss: the test process's own RSS (memory_info read just before and after brackets it)
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < host["workers_rss"] < 2 * rss
    assert len(host["cpu_per_core"]) == psutil.cpu_count()
    assert host["cpu_percent"] == pytest.approx(sum(host["cpu_per_core"]) / len(host["cpu_per_core"]), abs=0.01)
    assert 0 < host["ram_used"] < host["ram_total"] == psutil.virtual_memory().total
    assert sink.drain() == first + second and sink.drain() == []
    assert s.samples_taken == 2


def test_workers_rss_sums_every_pid_and_skips_gone_ones():
    own = psutil.Process().memory_info().rss
    gone = 2**22 + 12345  # above any default pid_max of 4M: no such process
    s = Sampler(gpu_source=None, pids=lambda: [os.getpid(), os.getpid(), gone])
    rss = s.sample_once()[0]["workers_rss"]
    assert 1.5 * own < rss < 2.5 * own
    assert Sampler(gpu_source=None).sample_once()[0]["workers_rss"] is None


def test_jsonl_sink_appends_rows_that_read_back(tmp_path):
    path = tmp_path / "logs" / "samples.jsonl"
    s = make_sampler(JsonlSink(path))
    rows = s.sample_once() + s.sample_once()
    back = [json.loads(line) for line in path.read_text().splitlines()]
    assert back == rows and len(back) == 6
    assert back[1]["throttle"] == ["power_cap", "thermal"] and back[5]["ts"] == 1001.0


def test_csv_sink_writes_one_header_and_json_lists(tmp_path):
    path = tmp_path / "samples.csv"
    s = make_sampler(CsvSink(path))
    s.sample_once()
    s.sample_once()
    with path.open() as f:
        back = list(csv.DictReader(f))
    assert len(back) == 6 and list(back[0]) == list(SAMPLE_COLUMNS)
    assert back[1]["source"] == "gpu1" and float(back[1]["gpu_util"]) == 12.0
    assert json.loads(back[1]["throttle"]) == ["power_cap", "thermal"]
    assert back[2]["gpu_util"] == "" and len(json.loads(back[2]["cpu_per_core"])) == psutil.cpu_count()


def test_queue_sink_rows_go_into_the_store(tmp_path):
    sink = QueueSink()
    make_sampler(sink).sample_once()
    store = Store.create(tmp_path)
    try:
        store.add_samples(sink.drain())
        df = store.samples()
    finally:
        store.close()
    assert list(df["source"]) == ["gpu0", "gpu1", "host"]
    assert df.loc[1, "gpu_util"] == 12.0 and json.loads(df.loc[1, "throttle"]) == ["power_cap", "thermal"]


def test_thread_samples_until_stopped_and_leaves_no_thread():
    sink = QueueSink()
    s = make_sampler(sink)
    s.interval = 3600.0  # only the immediate first sample: stop() must not wait for the next one
    taken = threading.Event()
    s.subscribe(lambda rows: taken.set())
    s.start()
    assert s.start() is s  # a second start is a no-op
    assert taken.wait(10)
    thread = s._thread
    assert thread.daemon and thread.name == "gpufill-sampler"
    s.stop()
    assert not thread.is_alive() and not s.running
    assert [r["source"] for r in sink.drain()] == ["gpu0", "gpu1", "host"]
    assert not [t for t in threading.enumerate() if t.name == "gpufill-sampler"]


def test_thread_keeps_sampling_at_the_interval():
    sink = QueueSink()
    clock = FakeClock()
    s = Sampler(interval=0.01, gpu_source=None, sink=sink, clock=clock)
    three = threading.Event()
    s.subscribe(lambda rows: s.samples_taken >= 3 and three.set())
    with s:
        assert three.wait(10)
    rows = sink.drain()
    assert len(rows) >= 3 and [r["ts"] for r in rows[:3]] == [1000.0, 1001.0, 1002.0]


def test_a_failing_sample_is_logged_once_and_the_thread_goes_on(caplog):
    class Broken(FakeGpus):
        def read(self, index):
            raise RuntimeError("GPU fell off the bus")

    s = Sampler(interval=0.001, gpu_source=Broken(), clock=FakeClock())
    attempts = threading.Event()
    calls = []

    def count(*args):
        calls.append(1)
        if len(calls) >= 3:
            attempts.set()
        return 1000.0

    s.clock = count
    with caplog.at_level(logging.WARNING, logger="gpufill"), s:
        assert attempts.wait(10)
    assert len([r for r in caplog.records if "monitor sample failed" in r.message]) == 1


# -- NVML through a fake module -------------------------------------------------------------
class FakeNvmlError(Exception):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


def fake_nvml(count=2, init_error=None, unsupported=()):
    def maybe(name, value):
        def call(*args):
            if name in unsupported:
                raise FakeNotSupported(name)
            return value(*args)
        return call

    def init():
        if init_error:
            raise init_error

    return SimpleNamespace(
        NVMLError=FakeNvmlError, NVMLError_NotSupported=FakeNotSupported, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetUtilizationRates=maybe("util", lambda h: SimpleNamespace(gpu=int(h[-1]) * 10 + 50, memory=5)),
        nvmlDeviceGetMemoryInfo=maybe("memory", lambda h: SimpleNamespace(used=3 * GIB, total=24 * GIB, free=21 * GIB)),
        nvmlDeviceGetPowerUsage=maybe("power", lambda h: 123456),
        nvmlDeviceGetEnforcedPowerLimit=maybe("limit", lambda h: 300000),
        nvmlDeviceGetTemperature=maybe("temp", lambda h, sensor: 71 if sensor == 0 else -1),
        nvmlDeviceGetClockInfo=maybe("clock", lambda h, kind: 1755 if kind == 1 else -1),
        nvmlDeviceGetCurrentClocksEventReasons=maybe("reasons", lambda h: 0x40 | 0x8),
    )


def test_nvml_source_reads_every_field_in_units():
    source = open_gpu_source(fake_nvml())
    assert isinstance(source, NvmlSource) and source.count() == 2
    assert source.read(1) == GpuReading(index=1, util=60.0, mem_used=3 * GIB, mem_total=24 * GIB, power_w=123.456,
                                        power_limit_w=300.0, temp_c=71.0, sm_clock_mhz=1755.0, throttle=("hw_slowdown", "hw_thermal"))


def test_nvml_fields_a_device_does_not_support_are_none():
    nvml = fake_nvml(unsupported=("power", "limit", "reasons"))
    reading = NvmlSource(nvml).read(0)
    assert reading.power_w is None and reading.power_limit_w is None and reading.throttle == ()
    assert reading.util == 50.0 and reading.temp_c == 71.0


def test_older_nvml_throttle_reasons_function_is_used():
    nvml = fake_nvml()
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4
    del nvml.nvmlDeviceGetCurrentClocksEventReasons
    assert NvmlSource(nvml).read(0).throttle == ("power_cap",)


def test_no_nvml_gives_none_with_one_notice_and_host_rows(caplog):
    with caplog.at_level(logging.INFO, logger="gpufill"):
        assert open_gpu_source() is None  # this machine has no NVML library
    notices = [r for r in caplog.records if r.name == "gpufill"]
    assert len(notices) == 1 and "GPU monitoring off" in notices[0].message
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpufill"):
        s = Sampler(gpu_source="auto", clock=FakeClock())
        rows = s.sample_once()
    assert len([r for r in caplog.records if r.name == "gpufill"]) == 1
    assert s.gpu_source is None and [r["source"] for r in rows] == ["host"] and rows[0]["ram_total"] > 0


def test_nvml_init_failure_or_no_device_is_host_only(caplog):
    with caplog.at_level(logging.INFO, logger="gpufill"):
        assert open_gpu_source(fake_nvml(init_error=FakeNvmlError("Driver Not Loaded"))) is None
        assert open_gpu_source(fake_nvml(count=0)) is None
    messages = [r.message for r in caplog.records if r.name == "gpufill"]
    assert len(messages) == 2 and "Driver Not Loaded" in messages[0] and "no GPU" in messages[1]


def test_one_sample_is_cheap():
    import time

    s = make_sampler()
    s.sample_once()
    tick = time.perf_counter()
    for _ in range(50):
        s.sample_once()
    per_sample = (time.perf_counter() - tick) / 50
    assert per_sample < 0.01  # 10 ms would be 1 % of a 1 s interval; it measures well under 1 ms here


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="interval must be positive"):
        Sampler(interval=0, gpu_source=None)
    assert sampler_module.log.name == "gpufill"
