"""Monitoring: the resource sampler (`sampler`), the training monitor (`training`) and alerts (`alerts`).

Names load lazily, on first use: the scheduler reads the sampler and the alerts without importing the training
monitor, whose hooks are torch's side (a process that needs no torch never imports it).
"""

from __future__ import annotations

from gpufill.lazy import lazy_names

# name -> submodule of gpufill.monitor that defines it
_HOME = {
    **dict.fromkeys(["Alert", "all_alerts", "high_memory", "idle_lane", "low_gpu_utilisation", "throttling"], "alerts"),
    **dict.fromkeys(["SAMPLE_COLUMNS", "CsvSink", "GpuReading", "GpuSource", "JsonlSink", "NvmlSource", "QueueSink", "Sampler",
                     "decode_throttle", "open_gpu_source"], "sampler"),
    **dict.fromkeys(["MonitorCallback", "NullMonitor", "TrainingMonitor"], "training"),
}
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
