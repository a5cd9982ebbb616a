"""Resource sampler: per-GPU readings through NVML and host readings through psutil.

A :class:`Sampler` takes one sample every ``interval`` seconds on a daemon thread: one row
per GPU (``source`` ``"gpu0"``, ``"gpu1"``, ...) and one ``"host"`` row. Rows are dicts with
exactly the keys of :data:`SAMPLE_COLUMNS` (the store's ``samples`` table); a field that
does not apply to the row (CPU fields on a GPU row, and the other way round) or that the
hardware does not report is ``None``.

Rows go to a sink, a callable taking a list of rows:

- :class:`QueueSink` for the campaign store: SQLite connections belong to one thread, so
  the sampler thread only queues rows and the store's owner (the scheduler) calls
  ``store.add_samples(sink.drain())`` in its own loop;
- :class:`JsonlSink` / :class:`CsvSink` for a standalone training (append, flush per batch).

No NVML (no driver, no GPU): :func:`open_gpu_source` logs one notice and returns ``None``,
and the sampler writes host rows only. NVML is reached only through the small
:class:`GpuSource` interface, so tests use a fake.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol, runtime_checkable

import psutil

from gpufill.errors import InputError
from gpufill.files import append_whole, make_folder

__all__ = [
    "SAMPLE_COLUMNS", "CsvSink", "GpuReading", "GpuSource", "JsonlSink", "NvmlSource", "QueueSink", "Sampler",
    "decode_throttle", "open_gpu_source",
]

log = logging.getLogger("gpufill")

# The store's samples table (campaign/store/store.py, Store.SAMPLE_COLUMNS); repeated here so the
# sampler does not import the store (and pandas) — a test checks that both agree.
SAMPLE_COLUMNS = ("ts", "source", "gpu_util", "mem_used", "mem_total", "power_w", "power_limit_w", "temp_c",
                  "sm_clock_mhz", "throttle", "cpu_percent", "cpu_per_core", "ram_used", "ram_total", "workers_rss")

# NVML's clocks event (formerly "throttle") reason bits -> short names. Idle, application
# clocks, sync boost and display clocks are benign; alerts.py picks the harmful ones.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "idle"),
    (0x002, "app_clocks"),
    (0x004, "power_cap"),        # software power cap: drawing at the enforced power limit
    (0x008, "hw_slowdown"),      # hardware slowdown (temperature or power brake, external signal)
    (0x010, "sync_boost"),
    (0x020, "thermal"),          # software thermal slowdown
    (0x040, "hw_thermal"),       # hardware thermal slowdown
    (0x080, "hw_power_brake"),   # external power brake assertion
    (0x100, "display_clocks"),
)


def decode_throttle(mask: int | None) -> tuple[str, ...]:
    """NVML's clocks throttle/event reasons bitmask -> reason names, in bit order."""
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment. ``None`` where the device does not report the field."""

    index: int
    util: float | None
    """Percent of the last sample period in which a kernel was running (NVML's utilisation)."""
    mem_used: float | None
    """Bytes."""
    mem_total: float | None
    """Bytes."""
    power_w: float | None
    power_limit_w: float | None
    """Enforced power limit, watts."""
    temp_c: float | None
    sm_clock_mhz: float | None
    throttle: tuple[str, ...] = ()
    """Decoded reasons (see :data:`THROTTLE_BITS`)."""


@runtime_checkable
class GpuSource(Protocol):
    def count(self) -> int: ...

    def read(self, index: int) -> GpuReading: ...


class NvmlSource:
    """:class:`GpuSource` over NVML (``nvidia-ml-py``). ``nvml`` is the module (a fake in tests)."""

    def __init__(self, nvml: ModuleType | Any | None = None):
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - optional at import time: the host-only path needs no NVML
        self.nvml = nvml
        nvml.nvmlInit()
        self._count = int(nvml.nvmlDeviceGetCount())
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]
        # Newer drivers name them "event" reasons; the "throttle" function is the older spelling.
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def count(self) -> int:
        return self._count

    def _get(self, call: Callable[..., Any] | None, *args: Any) -> Any:
        # Defensive: a field the device does not support (NVMLError_NotSupported), or any
        # other NVML error on one field, gives None for that field, never a failed sample.
        if call is None:
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def read(self, index: int) -> GpuReading:
        nvml, handle = self.nvml, self._handles[index]
        util = self._get(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._get(nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._get(nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._get(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        temp = self._get(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        clock = self._get(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        reasons = self._get(self._reasons, handle)
        return GpuReading(
            index=index,
            util=None if util is None else float(util.gpu),
            mem_used=None if memory is None else float(memory.used),
            mem_total=None if memory is None else float(memory.total),
            power_w=None if power_mw is None else power_mw / 1000.0,  # NVML reports milliwatts
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            temp_c=None if temp is None else float(temp),
            sm_clock_mhz=None if clock is None else float(clock),
            throttle=decode_throttle(reasons),
        )

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-initialised library is best effort
            pass


def open_gpu_source(nvml: ModuleType | Any | None = None) -> GpuSource | None:
    """An :class:`NvmlSource`, or None with one logged notice when NVML is missing or sees no GPU."""
    try:
        source = NvmlSource(nvml)
    except Exception as error:  # noqa: BLE001 - no driver, no library, no permission: all mean host-only
        log.info("GPU monitoring off: NVML could not start (%s); sampling CPU and RAM only", error or type(error).__name__)
        return None
    if source.count() == 0:
        log.info("GPU monitoring off: NVML sees no GPU; sampling CPU and RAM only")
        source.close()
        return None
    return source


Sink = Callable[[list[dict[str, Any]]], None]


class Sampler:
    """Samples GPUs and the host every ``interval`` seconds on a daemon thread.

    ``sample_once()`` takes one sample on the caller's thread (and passes it to the sink
    and subscribers like the thread does); ``start()`` / ``stop()`` run the thread; it is
    also a context manager.
    """

    def __init__(
        self,
        interval: float = 1.0,
        gpu_source: GpuSource | Literal["auto"] | None = "auto",
        pids: Callable[[], Iterable[int]] | None = None,
        sink: Sink | None = None,
        clock: Callable[[], float] = time.time,
    ):
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = float(interval)
        self.gpu_source: GpuSource | None = open_gpu_source() if gpu_source == "auto" else gpu_source
        self.pids = pids
        self.sink = sink
        self.clock = clock
        self.samples_taken = 0
        self._subscribers: tuple[Sink, ...] = ()  # replaced, never mutated: the thread reads it without a lock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._processes: dict[int, psutil.Process] = {}
        self._failed = False
        psutil.cpu_percent(percpu=True)  # the first call only sets psutil's baseline (it returns zeros)

    # -- one sample -----------------------------------------------------------------------
    def sample_once(self) -> list[dict[str, Any]]:
        rows = self.read()
        self.samples_taken += 1
        if self.sink is not None:
            self.sink(rows)
        for subscriber in self._subscribers:
            subscriber(rows)
        return rows

    def read(self) -> list[dict[str, Any]]:
        """One sample's rows, without passing them to the sink."""
        ts = float(self.clock())
        rows = []
        source = self.gpu_source
        for index in range(source.count() if source is not None else 0):
            g = source.read(index)
            rows.append(_row(ts, f"gpu{index}", gpu_util=g.util, mem_used=g.mem_used, mem_total=g.mem_total,
                             power_w=g.power_w, power_limit_w=g.power_limit_w, temp_c=g.temp_c,
                             sm_clock_mhz=g.sm_clock_mhz, throttle=list(g.throttle)))
        per_core = psutil.cpu_percent(percpu=True)
        memory = psutil.virtual_memory()
        rows.append(_row(ts, "host", cpu_percent=round(sum(per_core) / max(len(per_core), 1), 2),  # every core weighs the same
                         cpu_per_core=per_core, ram_used=float(memory.total - memory.available),
                         ram_total=float(memory.total), workers_rss=self._workers_rss()))
        return rows

    def _workers_rss(self) -> float | None:
        if self.pids is None:
            return None
        total, processes = 0, {}
        for pid in self.pids():
            try:
                process = self._processes.get(pid) or psutil.Process(pid)
                total += process.memory_info().rss
                processes[pid] = process
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # a worker that just exited is not an error
        self._processes = processes  # keep only live pids: no growth over a long campaign
        return float(total)

    # -- subscribers (TrainingMonitor) --------------------------------------------------------
    def subscribe(self, callback: Sink) -> Callable[[], None]:
        """Also pass every sample to ``callback``; returns the function that unsubscribes."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    # -- the thread -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Sampler:
        if self.running:
            return self
        self._stop.clear()
        # Daemon: a forgotten stop() never keeps the interpreter alive; stop() still joins it.
        self._thread = threading.Thread(target=self._run, name="gpufill-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the thread; returns as soon as the sample in progress (if any) is done."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - monitoring never takes the training down
                if not self._failed:
                    log.warning("monitor sample failed; continuing", exc_info=True)
                    self._failed = True
            # Fixed-rate schedule: the sample's own cost does not stretch the interval;
            # after a stall (suspend, overload) it resumes from now instead of catching up.
            deadline = max(deadline + self.interval, time.monotonic())
            if self._stop.wait(deadline - time.monotonic()):
                break

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _row(ts: float, source: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(SAMPLE_COLUMNS)
    row["ts"], row["source"] = ts, source
    row.update(values)
    return row


# -- sinks --------------------------------------------------------------------------------------
class QueueSink:
    """Thread-safe buffer: the sampler thread puts rows, the store's owner drains them."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._queue.put(row)

    def drain(self) -> list[dict[str, Any]]:
        rows = []
        while True:
            try:
                rows.append(self._queue.get_nowait())
            except queue.Empty:
                return rows


class JsonlSink:
    """Appends one JSON object per row to ``path``; flushed after every sample. Never through a link; a write
    that fails (a full disk) is cut back to the last whole line and ends the file's rows (``error`` says why)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        make_folder(self.path.parent, field="--out")
        self._lock = threading.Lock()
        self.error: str | None = None

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            if self.error is None:
                self.error = _append_whole(self.path, self._text(rows))

    def _text(self, rows: list[dict[str, Any]]) -> str:
        return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


class CsvSink(JsonlSink):
    """Appends rows to a CSV file (header written once, when the file is new or empty).

    Lists (``cpu_per_core``, ``throttle``) are written as JSON text, as the store does. Written as JsonlSink is.
    """

    def _text(self, rows: list[dict[str, Any]]) -> str:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=SAMPLE_COLUMNS)
        if not self.path.exists() or self.path.stat().st_size == 0:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in row.items()})
        return text.getvalue()


def _append_whole(path: Path, text: str) -> str | None:
    """Append `text` to `path` (files.append_whole: never through a link, never half a row); None, or why not."""
    try:
        append_whole(path, text, field="--out")  # opened per batch: nothing to close, safe to read meanwhile
    except InputError as error:
        return error.one_line()
    return None
