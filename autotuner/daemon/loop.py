"""The daemon's loop: poll production every `poll_interval_s`, keep it serving, fire triggers, run a cycle
when one is due.

Production first: a health task watches production's /health all the time (cycles included) and counts its
downtime from what production answers; a crash or an OOM is met at once — outside the maintenance window
too — by an emergency restart on a config with more headroom (the keeper), and only the re-tune waits for
the window. A cycle waiting for its window or for a person's approval is parked: the loop goes on polling.

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
from urllib.parse import urlsplit

import structlog

from autotuner.daemon.adoption import adopt, check_hand_edit, manual_restarts
from autotuner.daemon.config import LoadedConfig, load_config
from autotuner.daemon.cycle import CycleDriver
from autotuner.daemon.cycle_context import apply_changes
from autotuner.daemon.drive import drive, start_cycle
from autotuner.daemon.fingerprints import box_fingerprint, refusal_fingerprint
from autotuner.daemon.fleet_hooks import fleet_heartbeat
from autotuner.daemon.gpu_memory import production_foreign, production_free
from autotuner.daemon.health import HealthWatch
from autotuner.daemon.keeper import FreeMemory, Keeper
from autotuner.daemon.known_good import KnownGoodChain
from autotuner.daemon.mitigation import keep_serving
from autotuner.daemon.notify import Notifier
from autotuner.daemon.refusals import Refusals, backoff_s
from autotuner.daemon.runtime import RuntimeStore
from autotuner.daemon.state import DONE, Cycle, CycleStore
from autotuner.daemon.status import status_document
from autotuner.daemon.triggers import Trigger, TriggerWatch
from autotuner.errors import UserInputError
from autotuner.fleet.coordinator import ADOPT_TRIGGER, RETUNE_TRIGGER, STUDY, WARM_START, Fleet, Retune
from autotuner.proc_identity import create_time
from autotuner.scenario import Scenario
from autotuner.secrets import remember
from autotuner.store.db import Store
from autotuner.watch.inventory import gpu_inventory
from autotuner.watch.probe import probe
from autotuner.watch.snapshot import GpuInfo, ProductionSnapshot

log = structlog.get_logger("autotuner.daemon")

MANUAL = "manual"  # the trigger of `daemon run --once` when nothing else fired


class Daemon:
    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self.health = HealthWatch(self)
        self._load(load_config(config_path))
        self.stopping: asyncio.Event | None = None
        self.reload_requested = False
        self.port: int | None = None
        self.driver: CycleDriver | None = None
        self.last_poll: float | None = None
        self.last_snapshot: ProductionSnapshot | None = None
        self.noted: set[str] = set()  # trigger kinds already written since the last cycle (a due one fires each poll)
        self.active: Cycle | None = None  # the cycle being driven right now (not parked)
        self.hup_applied = False  # a SIGHUP's config already handed to the cycle in flight

    def _load(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.store = Store(loaded.storage_url)
        fleet = self.config.fleet
        # Boxes of a fleet share one database: each keeps its cycles, refusals and chain under its own name.
        deployment = loaded.scenario.name if fleet is None else f"{loaded.scenario.name}@{fleet.box}"
        self.fleet = None if fleet is None else Fleet(
            self.store.engine, fleet.box, deployment, lease_s=fleet.lease_s, healthy_s=fleet.canary_healthy_s,
            hold_s=self.config.min_interval_s, soak_s=fleet.soak_s)
        self.states = CycleStore(self.store, deployment)
        self.chain = KnownGoodChain(self.store, deployment)
        self.refusals = Refusals(self.store, deployment)
        self.runtime = RuntimeStore(self.store, deployment)
        from autotuner.deploy import make_target

        self.target = make_target(self.config.deploy, production_port=urlsplit(self.config.production.endpoint).port)
        self.watch = TriggerWatch(self.config.triggers, self.config.production.log)
        self.notifier = Notifier(self.config.notify, deployment)
        self.keeper = Keeper(target=self.target, endpoint=self.config.production.endpoint, states=self.states,
                             chain=self.chain, refusals=self.refusals, runtime=self.runtime,
                             startup_timeout_s=loaded.scenario.engine.startup_timeout_s,
                             free_memory=self.free_memory, notify=self.notify, box=self.box,
                             fingerprint=self.fingerprint, count_down=self.health.count_down)

    # --- facts ----------------------------------------------------------------------------------------
    def notify(self, event: str, text: str, detail: dict[str, Any]) -> None:
        self.notifier.notify(event, text, detail)

    def box(self) -> str:
        return box_fingerprint(self.states.reference())

    def production_scenario(self) -> Scenario:
        """What production was last tuned for: the deployed cycle's scenario, else the configured one."""
        deployed = self.states.last_deployed()
        changes = ((deployed.scenario or {}).get("changes") or {}) if deployed is not None else {}
        try:
            return apply_changes(self.loaded.scenario, changes) if changes else self.loaded.scenario
        except (UserInputError, ValueError):
            return self.loaded.scenario

    def fingerprint(self) -> tuple[str, str]:
        """What production's refusals are looked up under: its box and workload, and its box alone."""
        ref = self.states.reference()
        return refusal_fingerprint(ref, self.production_scenario()), box_fingerprint(ref)

    def free_memory(self) -> FreeMemory | None:
        return production_free(self.config.production.gpus)

    def foreign_memory(self) -> int | None:
        return production_foreign(self.config.production.endpoint, self.config.production.gpus,
                                  self.target.current(), bool(self.runtime.get().production_up))

    # --- status ------------------------------------------------------------------------------------
    def current_state(self) -> str:
        cycle = self.states.open_cycle()
        return cycle.state if cycle is not None else "idle"

    def status(self) -> dict[str, Any]:
        runtime = {"pid": os.getpid(), "endpoint_port": self.port,
                   "last_poll_at": None if self.last_poll is None else datetime.fromtimestamp(self.last_poll)
                   .astimezone().isoformat(timespec="seconds"),
                   "production_endpoint": self.config.production.endpoint}
        doc = status_document(self.states, self.config, runtime, target=self.target, runtime_store=self.runtime,
                              refusals=self.refusals, snapshot=self.last_snapshot)
        if self.fleet is not None:
            from autotuner.fleet.status import fleet_status

            doc["fleet"] = {"box": self.fleet.box, "group": self.fleet.group, "waiting": self.fleet.waiting,
                            **fleet_status(self.fleet.engine, self.fleet.group or None)}
        return doc

    def health_gauges(self) -> dict[str, Any]:
        rt = self.runtime.get()
        last = next((c for c in self.states.cycles(limit=5) if c.state == DONE), None)
        return {"production_up": rt.production_up, "last_poll_success_at": rt.last_poll_success_at,
                "downtime_seconds_total": rt.downtime_s, "last_cycle_outcome": last.outcome if last else None,
                "mitigations_total": len(self.states.events(kind="mitigation", limit=100_000)),
                "refusals_total": self.refusals.total()}

    # --- the loop ----------------------------------------------------------------------------------
    async def run(self, once: bool = False) -> int:
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
        registry.register(DaemonCollector(self.states, self.current_state, self.health_gauges))
        listen = self.config.listen
        # The endpoint's token is a secret whatever its variable is called: masked in what we write, and
        # kept from engines and deploy commands.
        remember(os.environ.get(listen.token_env))
        server = DaemonServer(build_app(self.status, registry, listen.token_env), listen.host, listen.port)
        self.port = await server.start()
        pid = os.getpid()
        self.runtime.set(pid=pid, create_time=create_time(pid), started_at=time.time(), heartbeat_at=time.time(),
                         stopped_at=None)
        log.info("daemon.started", config=str(self.config_path), deployment=self.states.deployment,
                 listen=f"{listen.host}:{self.port}", storage=self.store.url, pid=pid, once=once)
        self.warn_if_cycles_cannot_complete()
        health = asyncio.ensure_future(self.health.run())
        try:
            cycle = self.states.open_cycle()
            if cycle is not None:
                self.states.note("resumed", {"state": cycle.state}, cycle.id)
                await drive(self, cycle)
            if once and cycle is None:  # --once is one cycle: the resumed one (an approved proposal) is it
                await self.run_once()
            while not once and not self.stopping.is_set():
                if self.reload_requested:
                    self.reload()
                started = time.monotonic()
                await self.poll()
                wait = self.config.triggers.poll_interval_s - (time.monotonic() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=max(0.0, wait))
        finally:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await health
            # The health task may have last seen production down (a deploy's restart just before the exit):
            # what status reads after us is what production answers now.
            with contextlib.suppress(Exception):
                up = await self.keeper.healthy()
                if up != self.runtime.get().production_up:
                    self.runtime.set(production_up=up, production_since=time.time())
            self.runtime.set(stopped_at=time.time())
            await self.notifier.aclose(5.0)
            await server.stop()
            log.info("daemon.stopped", deployment=self.states.deployment)
        return 0

    def warn_if_cycles_cannot_complete(self) -> None:
        """Said once at start, not found out at the first trigger (the same check as `daemon plan`)."""
        from autotuner.daemon.plan import plan_cycle

        try:
            plan = plan_cycle(self.config_path, probe_production=False)
        except Exception as exc:  # the plan is advice: never a reason not to keep production serving
            log.warning("daemon.plan_failed", error=str(exc))
            return
        if not plan.can_complete:
            log.warning("daemon.cycles_cannot_complete", problems=plan.problems)

    async def run_once(self) -> None:
        """One poll; the cycle it starts (or a manual one when nothing fired) is driven to its end or park."""
        before = len(self.states.cycles(limit=1_000))
        await self.poll(force=True)
        if len(self.states.cycles(limit=1_000)) == before and self.states.open_cycle() is None:
            snap, gpus = await self.observe()
            await start_cycle(self, Trigger(MANUAL, {"why": "daemon run --once"}), snap, gpus)

    def request_stop(self) -> None:
        assert self.stopping is not None
        log.info("daemon.stopping", state=self.current_state())
        self.stopping.set()

    def request_reload(self) -> None:
        self.reload_requested = True

    def reload(self) -> None:
        """SIGHUP: read the config again; a bad file keeps the running config."""
        self.reload_requested = False
        self.hup_applied = False
        try:
            loaded = load_config(self.config_path)
        except UserInputError as exc:
            log.error("daemon.reload_failed", error=str(exc))
            return
        self._load(loaded)
        log.info("daemon.reloaded", config=str(self.config_path))

    def _reload_into_cycle(self) -> None:
        """SIGHUP during a cycle: its window, max_downtime and budgets apply to the cycle in flight at once
        (a window closed by the operator stops the tune); the rest (target, storage) after the cycle."""
        if self.hup_applied:
            return
        self.hup_applied = True
        try:
            loaded = load_config(self.config_path)
        except UserInputError as exc:
            log.error("daemon.reload_failed", error=str(exc))
            self.reload_requested = False
            return
        if self.driver is not None:
            self.driver.config = loaded.config
            log.info("daemon.reloaded_into_cycle", config=str(self.config_path), window=loaded.config.window)

    # --- polling -------------------------------------------------------------------------------------
    async def observe(self) -> tuple[ProductionSnapshot, tuple[GpuInfo, ...]]:
        p = self.config.production
        snap = await probe(p.endpoint, api_key_env=p.api_key_env)
        try:
            gpus = await asyncio.to_thread(gpu_inventory)
        except Exception as exc:  # no NVML on this box: GPU changes cannot be seen, the rest can
            log.debug("daemon.no_gpu_inventory", error=str(exc))
            gpus = ()
        self.last_poll = time.time()
        self.last_snapshot = snap
        if snap.reachable:
            self.runtime.set(last_poll_success_at=self.last_poll, heartbeat_at=self.last_poll)
        return snap, gpus

    async def poll(self, force: bool = False) -> None:
        try:
            await self._poll(force)
        except OSError as exc:  # out of file descriptors, a full disk: this poll is lost, not the daemon
            log.error("daemon.poll_failed", error=f"{type(exc).__name__}: {exc}")

    async def _poll(self, force: bool) -> None:
        snap, gpus = await self.observe()
        ref = self.states.reference()
        if ref is None and snap.reachable:
            ref = adopt(self, snap, gpus)
        open_cycle = self.states.open_cycle()
        if snap.reachable and open_cycle is None:
            check_hand_edit(self)
        cycles = self.states.cycles(limit=1)
        last_at = cycles[0].started_at if cycles else None
        adopted = self.states.events(kind="adopted", limit=1)
        since = last_at if last_at is not None else (adopted[0].at if adopted else None)
        fired = self.watch.observe(snap, gpus, ref, self.production_scenario(), since)
        fired = manual_restarts(self, fired, snap)
        await keep_serving(self, snap, fired)
        if self.fleet is not None and ref is not None:
            fleet_heartbeat(self, ref, snap.reachable)
        if open_cycle is not None:  # parked: one cycle at a time; see whether it may go on
            for t in fired:
                if t.kind not in self.noted:
                    self.noted.add(t.kind)
                    self.states.note("trigger", {"kind": t.kind, "evidence": t.evidence,
                                                 "action": f"cycle {open_cycle.id} in flight ({open_cycle.state})"})
            await drive(self, open_cycle)
            return
        step = self.fleet.pending(await asyncio.to_thread(self.foreign_memory)) if self.fleet is not None else None
        if isinstance(step, Retune):  # the group's winner, on a box with less memory free: tune for this one
            await start_cycle(self, Trigger(RETUNE_TRIGGER, step.evidence()), snap, gpus)
            return
        if step is not None and self.fleet is not None:  # the group's winner, and this box's turn: adopt it
            if self.fleet.adoption_started(step.rollout.id):
                await start_cycle(self, Trigger(ADOPT_TRIGGER, self.fleet.adoption_evidence(step)), snap, gpus)
            return
        if not fired:
            return
        trigger = fired[0]
        failures = self.states.failures_in_a_row()
        # min_interval_s counts from the last cycle's start; the backoff after failures from its end.
        wait = backoff_s(self.config.min_interval_s, failures)
        since_last = (cycles[0].ended_at or cycles[0].started_at) if failures and cycles else last_at
        deferred = not force and since_last is not None and time.time() - since_last < wait
        for t in fired:
            if t.kind in self.noted:
                continue
            self.noted.add(t.kind)
            why = f"deferred (min_interval_s{f', backoff after {failures} failed cycles' if failures else ''})"
            action = why if deferred else "cycle" if t is trigger else f"with {trigger.kind}"
            self.states.note("trigger", {"kind": t.kind, "evidence": t.evidence, "action": action})
        if deferred:
            return
        if self.fleet is not None:  # one box of the group tunes; the others adopt its winner
            answer = self.fleet.ask_to_tune()
            if not answer.tune:
                if "fleet" not in self.noted:
                    self.noted.add("fleet")
                    self.states.note("trigger", {"kind": trigger.kind, "action": f"fleet: {answer.why}"})
                return
            trigger = Trigger(trigger.kind, {**trigger.evidence, STUDY: answer.study, WARM_START: answer.warm_start,
                                             "fleet": answer.why})
        self.noted.clear()
        await start_cycle(self, trigger, snap, gpus)

    def own_traffic(self, start_s: float, end_s: float) -> None:
        """The daemon's verify (and soak) prompts are not production's workload: not drift."""
        self.watch.own_traffic(start_s, end_s)

