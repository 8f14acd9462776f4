"""Production's health, all the time: /health every second beside the poll loop and the cycles, whether
production is up and since when, and the downtime it showed — planned when a cycle took it down,
unplanned otherwise. A restart the keeper times itself (to the moment /health answers) is not counted
again here. When production dies during a cycle that needs it serving, the restore starts from here (the
poll loop is inside the cycle)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from autotuner.daemon.loop import Daemon

log = structlog.get_logger("autotuner.daemon")

HEALTH_INTERVAL_S = 1.0
HEARTBEAT_S = 5.0
DOWN_GRACE_S = 3.0


class HealthWatch:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.down_seen_at: float | None = None  # production unreachable and its target says not running, since
        self.restoring: asyncio.Future[Any] | None = None  # a restore this task started during a cycle

    async def run(self) -> None:
        """/health every second: production up or down, since when, and the downtime it showed — planned
        when a cycle took it down, unplanned otherwise. Runs beside cycles; never raises."""
        last_tick = time.time()
        last_beat = 0.0
        up_state: bool | None = None
        interval = min(HEALTH_INTERVAL_S, self.daemon.config.triggers.poll_interval_s)
        while True:
            try:
                up = await self.daemon.keeper.healthy(timeout_s=2.0)
                now = time.time()
                if up_state is not None and not up_state and not self.daemon.keeper.restarts_in_flight:
                    # What a restart took, the keeper counted (to the second /health answered).
                    since = max(last_tick, self.daemon.keeper.counted_until)
                    if now > since:
                        self.count_down(now - since)
                if up != up_state:
                    rt = self.daemon.runtime.get()
                    self.daemon.runtime.set(production_up=up, production_since=now,
                                            production_error=None if up else "no 200 from /health")
                    planned = self._planned()
                    if up_state is not None:
                        self.daemon.states.note("production-up" if up else "production-went-down",
                                                {"planned": planned, "alarm": rt.alarm})
                    if not up and not planned and up_state is not None:
                        self.daemon.notify("production-down", "production stopped answering /health", {})
                    up_state = up
                if self.daemon.reload_requested and self.daemon.driver is not None:
                    self.daemon._reload_into_cycle()
                if not up and self.daemon.active is not None and not self._planned():
                    self._restore_during_cycle(now)
                if now - last_beat >= HEARTBEAT_S:
                    self.daemon.runtime.set(heartbeat_at=now)
                    last_beat = now
                last_tick = now
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database busy, a resource error: try again next tick
                log.warning("daemon.health_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(interval)

    def _restore_during_cycle(self, now: float) -> None:
        """Production died while a cycle that needs it serving runs (a virtual-time tune, a wait for the
        window): the poll loop is inside the cycle, so the health task starts the restore. The OOM lines stay
        unread for the poll after the cycle (its refusal and re-tune); production comes back now."""
        if self.down_seen_at is None:
            self.down_seen_at = now
        if now - self.down_seen_at < DOWN_GRACE_S or (self.restoring is not None and not self.restoring.done()):
            return
        if now < self.daemon.keeper.next_try_at:
            return
        live = self.daemon.target.current()
        self.restoring = asyncio.ensure_future(self.daemon.keeper.bring_up(
            "production down during a cycle", first=self.daemon.keeper.restore_flags(live)))

    def _planned(self) -> bool:
        cycle = self.daemon.active
        return cycle is not None and cycle.down_since is not None

    def count_down(self, seconds: float) -> None:
        planned = self._planned()
        self.daemon.runtime.add_downtime(seconds, planned)
        if self.daemon.active is not None:
            self.daemon.states.add_downtime(self.daemon.active.id, seconds)

