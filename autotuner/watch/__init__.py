"""Watching a production vLLM: what it serves, on which GPUs, with what traffic, and whether it OOMs."""

from autotuner.watch.drift import Drift, prompt_drift
from autotuner.watch.fingerprint import model_fingerprint
from autotuner.watch.inventory import gpu_inventory
from autotuner.watch.oom import oom_lines
from autotuner.watch.probe import probe
from autotuner.watch.scheduler_dump import CrashStep, crash_steps
from autotuner.watch.snapshot import GpuInfo, LengthHistogram, ProductionSnapshot

__all__ = [
    "CrashStep",
    "Drift",
    "GpuInfo",
    "LengthHistogram",
    "ProductionSnapshot",
    "crash_steps",
    "gpu_inventory",
    "model_fingerprint",
    "oom_lines",
    "probe",
    "prompt_drift",
]
