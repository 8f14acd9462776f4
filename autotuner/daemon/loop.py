"""The daemon's loop: poll production every `poll_interval_s`, fire triggers, run a cycle when one is due.

Signals: SIGTERM (and SIGINT) finish the step in flight — a tune is stopped and the previous config goes
back up, a deploy is verified (or rolled back) — then the daemon exits 0. SIGHUP reloads the config file (a
bad one is logged and the old one kept). After a SIGKILL the next start resumes the persisted cycle at its
step; engines of a killed tuner are reaped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from autotuner.daemon.config import LoadedConfig, load_config
from autotuner.daemon.cycle import CycleDriver
from autotuner.daemon.state import DEPLOYED, DONE, CycleStore
from autotuner.daemon.status import status_document
from autotuner.daemon.triggers import CRASH, OOM, Trigger, TriggerWatch, identity
from autotuner.deploy import DeployError, make_target
from autotuner.errors import UserInputError
from autotuner.store.db import Store
from autotuner.watch.fingerprint import model_fingerprint
from autotuner.watch.inventory import gpu_inventory
from autotuner.watch.probe import probe
from autotuner.watch.snapshot import GpuInfo, ProductionSnapshot

log = structlog.get_logger("autotuner.daemon")


class Daemon:
    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self._load(load_config(config_path))
        self.stopping: asyncio.Event | None = None
        self.reload_requested = False
        self.port: int | None = None
        self.driver: CycleDriver | None = None
        self.last_poll: float | None = None
        self.noted: set[str] = set()  # trigger kinds already written since the last cycle (a due one fires each poll)

    def _load(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.store = Store(self.config.storage_url())
        self.states = CycleStore(self.store, loaded.scenario.name)
        self.target = make_target(self.config.deploy)
        self.watch = TriggerWatch(self.config.triggers, self.config.production.log)

    # --- status ------------------------------------------------------------------------------------
    def current_state(self) -> str:
        cycle = self.states.open_cycle()
        return cycle.state if cycle is not None else "idle"

    def status(self) -> dict[str, Any]:
        runtime = {"pid": os.getpid(), "endpoint_port": self.port,
                   "last_poll_at": None if self.last_poll is None else datetime.fromtimestamp(self.last_poll)
                   .astimezone().isoformat(timespec="seconds"),
                   "production": self.config.production.endpoint}
        return status_document(self.states, self.config, runtime)

    # --- the loop ----------------------------------------------------------------------------------
    async def run(self) -> int:
        from prometheus_client import CollectorRegistry

        from autotuner.daemon.http import DaemonCollector, DaemonServer, build_app
        from autotuner.engine.registry import EngineRegistry

        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        reaped = await asyncio.to_thread(EngineRegistry().reap_orphans)
        if reaped:
            log.warning("daemon.reaped_orphans", pgids=reaped)
        registry = CollectorRegistry(auto_describe=True)
        registry.register(DaemonCollector(self.states, self.current_state))
        listen = self.config.listen
        server = DaemonServer(build_app(self.status, registry, listen.token_env), listen.host, listen.port)
        self.port = await server.start()
        log.info("daemon.started", config=str(self.config_path), deployment=self.states.deployment,
                 listen=f"{listen.host}:{self.port}", storage=self.store.url, pid=os.getpid())
        try:
            cycle = self.states.open_cycle()
            if cycle is not None:
                self.states.note("resumed", {"state": cycle.state}, cycle.id)
                await self.drive(cycle)
            while not self.stopping.is_set():
                if self.reload_requested:
                    self.reload()
                started = time.monotonic()
                await self.poll()
                wait = self.config.triggers.poll_interval_s - (time.monotonic() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=max(0.0, wait))
        finally:
            await server.stop()
            log.info("daemon.stopped", deployment=self.states.deployment)
        return 0

    def request_stop(self) -> None:
        assert self.stopping is not None
        log.info("daemon.stopping", state=self.current_state())
        self.stopping.set()

    def request_reload(self) -> None:
        self.reload_requested = True

    def reload(self) -> None:
        """SIGHUP: read the config again; a bad file keeps the running config."""
        self.reload_requested = False
        try:
            loaded = load_config(self.config_path)
        except UserInputError as exc:
            log.error("daemon.reload_failed", error=str(exc))
            return
        self._load(loaded)
        log.info("daemon.reloaded", config=str(self.config_path))

    async def observe(self) -> tuple[ProductionSnapshot, tuple[GpuInfo, ...]]:
        p = self.config.production
        snap = await probe(p.endpoint, api_key_env=p.api_key_env)
        try:
            gpus = await asyncio.to_thread(gpu_inventory)
        except Exception as exc:  # no NVML on this box: GPU changes cannot be seen, the rest can
            log.debug("daemon.no_gpu_inventory", error=str(exc))
            gpus = ()
        self.last_poll = time.time()
        return snap, gpus

    def adopt(self, snap: ProductionSnapshot, gpus: tuple[GpuInfo, ...]) -> dict[str, Any]:
        """First sight of production: it becomes the reference, except for a model other than the
        scenario's, which counts as a swap from the scenario's model."""
        ref = identity(snap, gpus)
        scenario = self.loaded.scenario
        tuned = model_fingerprint(scenario.engine.model, scenario.engine.served_model_name or snap.served_model)
        if tuned is not None and snap.root != scenario.engine.model:
            ref.update(model_fingerprint=tuned, root=scenario.engine.model)
        self.states.set_reference(ref)
        self.states.note("adopted", {"reference": ref})
        return ref

    async def poll(self) -> None:
        snap, gpus = await self.observe()
        ref = self.states.reference()
        if ref is None and snap.reachable:
            ref = self.adopt(snap, gpus)
        cycles = self.states.cycles(limit=1)
        last_at = cycles[0].started_at if cycles else None
        adopted = self.states.events(kind="adopted", limit=1)
        since = last_at if last_at is not None else (adopted[0].at if adopted else None)
        fired = self.watch.observe(snap, gpus, ref, self.loaded.scenario, since)
        if not fired:
            return
        trigger = fired[0]
        deferred = last_at is not None and time.time() - last_at < self.config.min_interval_s
        for t in fired:
            if t.kind in self.noted:
                continue
            self.noted.add(t.kind)
            action = "deferred (min_interval_s)" if deferred else "cycle" if t is trigger else f"with {trigger.kind}"
            self.states.note("trigger", {"kind": t.kind, "evidence": t.evidence, "action": action})
        if deferred:
            if trigger.kind in (OOM, CRASH) and not snap.reachable:
                await self.restart_production()
            return
        self.noted.clear()
        await self.start_cycle(trigger, snap, gpus)

    async def restart_production(self) -> None:
        """Production died and no cycle may start yet: put the live config back up."""
        try:
            await asyncio.to_thread(self.target.apply)
            self.states.note("restarted", {"reason": "production was down and no cycle may start yet"})
        except DeployError as exc:
            log.error("daemon.restart_failed", error=str(exc))

    async def start_cycle(self, trigger: Trigger, snap: ProductionSnapshot, gpus: tuple[GpuInfo, ...]) -> None:
        cycle = self.states.begin(trigger.kind, trigger.evidence, identity(snap, gpus))
        await self.drive(cycle)

    async def drive(self, cycle: Any) -> None:
        from autotuner.engine.registry import autotuner_home

        assert self.stopping is not None
        scenario = self.loaded.scenario
        self.driver = CycleDriver(self.loaded, self.states, self.store, self.target, self.stopping,
                                  autotuner_home() / "logs" / f"{scenario.name}-daemon")
        try:
            cycle = await self.driver.run(cycle)
        finally:
            self.driver = None
        assert cycle.state == DONE
        if cycle.outcome == DEPLOYED:  # else the trigger stands and fires again after min_interval_s
            await self.refresh_reference(cycle)
        self.watch.forget()

    async def refresh_reference(self, cycle: Any) -> None:
        """After a cycle, production as it now runs is the yardstick (so a swap fires once, not forever)."""
        snap, gpus = await self.observe()
        if snap.reachable:
            ref = identity(snap, gpus)
            ref["study"] = cycle.study_name
            self.states.set_reference(ref)


def run_daemon(config_path: Path) -> int:
    daemon = Daemon(config_path)
    return asyncio.run(daemon.run())
