"""A running trial's heartbeat on a shared study database: while it is measured, Optuna's storage
hears from it every interval, so another worker tells a live trial from a dead worker's (recovery.py).
SQLite studies have no heartbeat (one tuner per database: the study lock says so)."""

from __future__ import annotations

import asyncio

import optuna
from optuna.storages import RDBStorage


async def heartbeat(storage: RDBStorage, trial: optuna.Trial) -> None:
    """Runs until cancelled; returns at once when the storage keeps no heartbeats."""
    interval = storage.get_heartbeat_interval()
    while interval:
        await asyncio.to_thread(storage.record_heartbeat, trial._trial_id)
        await asyncio.sleep(interval)
