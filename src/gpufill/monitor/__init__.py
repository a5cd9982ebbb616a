"""Monitoring: the resource sampler, the training monitor and alerts."""

from gpufill.monitor.alerts import Alert, all_alerts, high_memory, idle_lane, low_gpu_utilisation, throttling
from gpufill.monitor.sampler import (
    SAMPLE_COLUMNS, CsvSink, GpuReading, GpuSource, JsonlSink, NvmlSource, QueueSink, Sampler, decode_throttle, open_gpu_source,
)
from gpufill.monitor.training import MonitorCallback, NullMonitor, TrainingMonitor

__all__ = [
    "SAMPLE_COLUMNS", "Alert", "CsvSink", "GpuReading", "GpuSource", "JsonlSink", "MonitorCallback", "NullMonitor",
    "NvmlSource", "QueueSink", "Sampler", "TrainingMonitor", "all_alerts", "decode_throttle", "high_memory", "idle_lane",
    "low_gpu_utilisation", "open_gpu_source", "throttling",
]
