"""Background memory sampling for one engine lifetime, with an OOM-threshold callback.

The sampler thread reads the monitor on a fixed grid (``t0 + k/hz`` on ``time.perf_counter()``): no
drift, and a sample that overruns its slot skips the slots it missed instead of bursting to catch
up. The first sample is taken in ``start()`` on the caller's thread, so a monitor that cannot read
fails there, and the baseline is the memory before the run.

The threshold callback runs on the sampler thread, once per run, at the first sample that reaches
the limit on any device: the caller stops the engine from it. (Only a first sample already over the
limit runs it inside ``start()``, on the caller's thread.) It must not block for long: sampling, and
so the recorded peak, waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import structlog

from autotuner.monitor.base import DeviceInfo, MemoryMonitor, MonitorError
from autotuner.monitor.timeline import PeakTimeline, TimelinePoint

MIB = 1 << 20
DEFAULT_FRACTION = 0.97
# NVML can time out once in a while under load; only a run of failures means the monitor is gone.
MAX_CONSECUTIVE_ERRORS = 5

log = structlog.get_logger(__name__)

# Hears ("memory", {used_bytes, peak_bytes, total_bytes, limit_bytes, gpus}) from the sampler thread,
# like a Tuner's on_event; set by whoever shows a live view (a context variable: no argument to pass
# through the study, the runner and the trial).
MemoryListener = Callable[[str, dict[str, Any]], None]
memory_listener: ContextVar[MemoryListener | None] = ContextVar("memory_listener", default=None)
LISTENER_PERIOD_S = 0.25


@dataclass(frozen=True)
class Threshold:
    """The OOM wall per device: ``fraction`` of its total, or ``min_free_mib`` below its total."""

    fraction: float | None = DEFAULT_FRACTION
    min_free_mib: float | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.min_free_mib is None):
            raise ValueError("a Threshold takes exactly one of fraction and min_free_mib")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"threshold fraction must be in (0, 1], not {self.fraction}")
        if self.min_free_mib is not None and self.min_free_mib < 0:
            raise ValueError(f"threshold min_free_mib must be ≥ 0, not {self.min_free_mib}")

    @classmethod
    def of_total(cls, fraction: float = DEFAULT_FRACTION) -> Threshold:
        return cls(fraction=fraction)

    @classmethod
    def min_free(cls, mib: float) -> Threshold:
        return cls(fraction=None, min_free_mib=mib)

    def limit_bytes(self, total_bytes: int) -> int:
        """Used bytes at or above which the device counts as out of memory."""
        if self.fraction is not None:
            return int(total_bytes * self.fraction)
        assert self.min_free_mib is not None
        return max(0, total_bytes - int(self.min_free_mib * MIB))


@dataclass(frozen=True)
class ThresholdEvent:
    position: int  # in the monitor's device list
    index: int  # the device's own index (NVML index for a GPU)
    used_bytes: int
    total_bytes: int
    limit_bytes: int
    t_s: float  # since the run's start (the first sample)


@dataclass(frozen=True)
class MemorySummary:
    devices: list[DeviceInfo]
    peak_bytes: list[int]
    total_bytes: list[int]
    baseline_bytes: list[int]  # the first sample, taken in start()
    peak_fraction: float  # max over devices of peak / total
    samples: int
    duration_s: float  # first sample to last
    sample_hz: float  # achieved
    timeline: list[TimelinePoint]  # (t_s, used bytes per device), per-bucket maxima
    threshold_event: ThresholdEvent | None
    sample_errors: int  # failed reads that were retried


class Sampler:
    """One run at a time: ``start()``, then ``stop()`` returns that run's summary; reusable after."""

    def __init__(
        self,
        monitor: MemoryMonitor,
        hz: float = 100.0,
        threshold: Threshold | None = None,
        on_threshold: Callable[[ThresholdEvent], None] | None = None,
        max_points: int = 600,
        on_sample: MemoryListener | None = None,
    ) -> None:
        if not hz > 0:
            raise ValueError(f"sampling rate must be positive, not {hz}")
        self.monitor = monitor
        self.hz = hz
        self.threshold = threshold
        self.on_threshold = on_threshold
        self.max_points = max_points
        # A live view (set around a whole `tune` run) hears the peaks so far, a few times a second.
        self.on_sample = on_sample if on_sample is not None else memory_listener.get()
        self._heard_at = 0.0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._reset()

    def _reset(self) -> None:
        self._devices = self.monitor.devices()
        totals = [d.total_bytes for d in self._devices]
        self._limits = [self.threshold.limit_bytes(t) for t in totals] if self.threshold else None
        self._timeline = PeakTimeline(self.max_points)
        self._peak: list[int] = [0] * len(self._devices)
        self._baseline: list[int] = []
        self._last: list[int] | None = None
        self._samples = 0
        self._last_t = 0.0
        self._event: ThresholdEvent | None = None
        self._errors = 0
        self._failure: BaseException | None = None
        self._t0 = 0.0

    # ---- control

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("Sampler already running")
        self._reset()
        self._stopping.clear()
        self._t0 = time.perf_counter()
        first = self.monitor.sample()
        self._baseline = list(first)
        self._record(0.0, first)
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> MemorySummary:
        """Stop sampling and summarise the run; raises ``MonitorError`` if the monitor failed during it."""
        if self._thread is None:
            raise RuntimeError("Sampler not running")
        self._stopping.set()
        self._thread.join()
        self._thread = None
        if self._failure is not None:
            raise MonitorError(f"memory sampling failed during the run: {self._failure}") from self._failure
        return self._summary()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def failure(self) -> BaseException | None:
        """Why sampling stopped early, while still running: nobody is watching the OOM wall any more."""
        return self._failure

    @property
    def last_sample(self) -> list[int] | None:
        return self._last

    def mark(self) -> tuple[float, list[int]]:
        """Where one part of a run ends and the next begins: the seconds since start() of the last
        sample, and per device the peak until then."""
        return self._last_t, list(self._peak)

    @property
    def threshold_event(self) -> ThresholdEvent | None:
        return self._event

    # ---- the sampler thread

    def _run(self) -> None:
        period = 1.0 / self.hz
        next_t = self._t0 + period
        consecutive = 0
        while True:
            delay = next_t - time.perf_counter()
            if (delay > 0 and self._stopping.wait(delay)) or self._stopping.is_set():
                return
            now = time.perf_counter()
            try:
                values = self.monitor.sample()
            except MonitorError as exc:
                self._errors += 1
                consecutive += 1
                if consecutive >= MAX_CONSECUTIVE_ERRORS:
                    self._failure = exc
                    log.error("memory_sampler.failed", error=str(exc), consecutive=consecutive)
                    return
            except Exception as exc:
                self._failure = exc
                log.exception("memory_sampler.crashed")
                return
            else:
                consecutive = 0
                self._record(now - self._t0, values)
            next_t += period
            late = time.perf_counter() - next_t
            if late >= 0:
                next_t += (int(late // period) + 1) * period

    def _record(self, t_s: float, values: list[int]) -> None:
        self._samples += 1
        self._last_t = t_s
        self._last = values
        self._peak = [max(p, v) for p, v in zip(self._peak, values, strict=True)]
        self._timeline.add(t_s, values)
        if self._limits is not None and self._event is None:
            for position, (used, limit) in enumerate(zip(values, self._limits, strict=True)):
                if used >= limit:
                    self._fire(position, used, limit, t_s)
                    break
        if self.on_sample is not None and (t_s - self._heard_at >= LISTENER_PERIOD_S or t_s == 0.0):
            self._heard_at = t_s
            self._tell_listener(values)

    def _tell_listener(self, values: list[int]) -> None:
        try:
            self.on_sample("memory", {"used_bytes": list(values), "peak_bytes": list(self._peak),
                                      "total_bytes": [d.total_bytes for d in self._devices],
                                      "limit_bytes": list(self._limits) if self._limits else None,
                                      "gpus": [d.index for d in self._devices]})
        except Exception:
            log.exception("memory_sampler.listener_failed")

    def _fire(self, position: int, used: int, limit: int, t_s: float) -> None:
        device = self._devices[position]
        self._event = ThresholdEvent(position, device.index, used, device.total_bytes, limit, t_s)
        if self.on_threshold is None:
            return
        try:
            self.on_threshold(self._event)
        except Exception:
            # The caller's stop path failing must not blind the sampler; the event is recorded anyway.
            log.exception("memory_sampler.threshold_callback_failed")

    def _summary(self) -> MemorySummary:
        totals = [d.total_bytes for d in self._devices]
        duration = self._last_t
        return MemorySummary(
            devices=list(self._devices),
            peak_bytes=list(self._peak),
            total_bytes=totals,
            baseline_bytes=list(self._baseline),
            peak_fraction=max((p / t for p, t in zip(self._peak, totals, strict=True) if t > 0), default=0.0),
            samples=self._samples,
            duration_s=duration,
            sample_hz=(self._samples - 1) / duration if duration > 0 else 0.0,
            timeline=self._timeline.points(),
            threshold_event=self._event,
            sample_errors=self._errors,
        )
