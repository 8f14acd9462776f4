"""Memory monitors (NVML, simulated NVML, host RAM) and the background sampler that watches the OOM wall."""

from autotuner.monitor.base import (
    DeviceInfo,
    MemoryMonitor,
    MonitorConfigError,
    MonitorError,
    NvmlUnavailableError,
)
from autotuner.monitor.checks import busy_devices, wait_for_release, wait_until
from autotuner.monitor.factory import MONITOR_KINDS, MonitorKind, open_monitor
from autotuner.monitor.host import HostMonitor
from autotuner.monitor.nvml import NvmlMonitor
from autotuner.monitor.sampler import MemorySummary, Sampler, Threshold, ThresholdEvent
from autotuner.monitor.timeline import PeakTimeline, downsample_max

__all__ = [
    "MONITOR_KINDS",
    "DeviceInfo",
    "HostMonitor",
    "MemoryMonitor",
    "MemorySummary",
    "MonitorConfigError",
    "MonitorError",
    "MonitorKind",
    "NvmlMonitor",
    "NvmlUnavailableError",
    "PeakTimeline",
    "Sampler",
    "Threshold",
    "ThresholdEvent",
    "busy_devices",
    "downsample_max",
    "open_monitor",
    "wait_for_release",
    "wait_until",
]
