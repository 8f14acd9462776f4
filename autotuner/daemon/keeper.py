"""Production first: whatever a step did, the keeper brings production back to serving, or raises the alarm.

`bring_up` tries, in order: the config asked for (the previous one after a failed candidate, a mitigation
after an OOM), with retries and backoff; then the last-known-good chain, newest first. Before each start it
reads what the GPUs have free: when another process took memory, the config's `gpu-memory-utilization` is
lowered to what fits (vLLM refuses to start when free memory is below utilization × total), as the tuner
bounds its search space, and the keeper says so. A config production refused is skipped. When nothing
serves, the deployment is marked down with an alarm (runtime row, event, webhook) and the daemon keeps
trying with backoff at every poll.

`mitigate` is the emergency path for a crash or an OOM outside the maintenance window: production comes
back at once on the known-good config with the most headroom for what crashed it, or on the current one
with the token budget lowered below the crashing step; the re-tune waits for the window.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_attempt, wait_exponential

from autotuner.daemon.known_good import KnownGoodChain, flags_key
from autotuner.daemon.refusals import Refusals
from autotuner.daemon.runtime import RuntimeStore
from autotuner.daemon.state import CycleStore
from autotuner.deploy import DeployError, DeployTarget
from autotuner.vllm import defaults
from autotuner.vllm.flags import UTILIZATION

log = structlog.get_logger("autotuner.daemon")

READY_POLL_S = 0.25
# Below this utilization a 24 GB card holds little more than a small model's weights: not worth a start.
MIN_FITTED_UTILIZATION = 0.3
# vLLM compares free memory with utilization × total at startup; a little margin for what moves meanwhile.
FIT_MARGIN = 0.01
# Retries of the first config before the chain is walked (a start that failed for a transient reason).
FIRST_ATTEMPTS = 2
# Mitigation: the budget goes to half the crashing step, never below this many tokens.
MIN_BATCHED_TOKENS = 256
BATCHED = "max-num-batched-tokens"


class NotServingError(DeployError):
    """Production did not come back on a config (the message says why)."""


@dataclass
class BringUp:
    ok: bool
    flags: dict[str, Any] | None = None
    source: str | None = None  # asked | chain
    fitted: str | None = None  # how the utilization was lowered to fit free memory
    tried: list[str] = field(default_factory=list)  # what failed, in order

    @property
    def reason(self) -> str:
        return "; ".join(self.tried[-3:]) or "nothing to start"


@dataclass(frozen=True)
class FreeMemory:
    """What the production GPUs have free now (the smallest share over them)."""

    total_bytes: int
    free_bytes: int

    @property
    def fraction(self) -> float:
        return self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def fit_to_free(flags: dict[str, Any], free: FreeMemory | None) -> tuple[dict[str, Any], str | None]:
    """`flags` with the utilization lowered to what is free, and a sentence saying so; unchanged when it fits.
    None flags when even the floor does not fit."""
    if free is None or free.total_bytes <= 0:
        return flags, None
    util = float(flags.get(UTILIZATION, defaults.GPU_MEMORY_UTILIZATION))
    room = math.floor(round((free.fraction - FIT_MARGIN) * 100, 6)) / 100  # round: 0.89 * 100 is 88.999…
    if util <= room:
        return flags, None
    if room < MIN_FITTED_UTILIZATION:
        raise NotServingError(f"only {free.free_bytes / 2**30:.1f} of {free.total_bytes / 2**30:.1f} GiB free on a "
                         f"production GPU: not enough for any utilization ≥ {MIN_FITTED_UTILIZATION}")
    note = (f"gpu-memory-utilization lowered {util:g} → {room:g}: {free.free_bytes / 2**30:.1f} of "
            f"{free.total_bytes / 2**30:.1f} GiB free on a production GPU (another process holds the rest)")
    return {**flags, UTILIZATION: room}, note


def mitigated(flags: dict[str, Any], crash_tokens: int | None) -> dict[str, Any] | None:
    """The current config with the token budget below the crashing step (half of it): fewer tokens per step,
    less activation memory on top of the KV cache. None when it cannot go lower."""
    budget = flags.get(BATCHED)
    current = int(budget) if isinstance(budget, int | float) and not isinstance(budget, bool) else None
    step = crash_tokens or current
    if step is None:
        return None
    lowered = max(MIN_BATCHED_TOKENS, (min(step, current or step) // 2) // 16 * 16)
    if current is not None and lowered >= current:
        return None
    return {**flags, BATCHED: lowered}


class Keeper:
    def __init__(self, *, target: DeployTarget, endpoint: str, states: CycleStore, chain: KnownGoodChain,
                 refusals: Refusals, runtime: RuntimeStore, startup_timeout_s: float,
                 free_memory: Callable[[], FreeMemory | None], notify: Callable[[str, str, dict[str, Any]], None],
                 box: Callable[[], str], fingerprint: Callable[[], tuple[str, ...]],
                 count_down: Callable[[float], None]) -> None:
        self.target = target
        self.endpoint = endpoint.rstrip("/")
        self.states = states
        self.chain = chain
        self.refusals = refusals
        self.runtime = runtime
        self.startup_timeout_s = startup_timeout_s
        self.free_memory = free_memory
        self.notify = notify
        self.box = box
        self.fingerprint = fingerprint
        self.count_down = count_down
        self.failures = 0  # bring-ups in a row that left production down
        self.next_try_at = 0.0
        # A restart is timed here, to the moment /health answers again: the health task's one-second look
        # would miss a restart that takes less, and must not count the same seconds twice.
        self.restarts_in_flight = 0
        self.counted_until = 0.0

    # --- is it serving -------------------------------------------------------------------------------
    async def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=timeout_s) as http:
                return (await http.get(self.endpoint + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def ready(self, timeout_s: float) -> str | None:
        """None once production answers /health with 200; else why not. Returns at once when the target
        knows the service is not running (a supervised start that exited), instead of waiting it out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            while time.monotonic() < deadline:
                try:
                    r = await http.get(self.endpoint + "/health")
                    if r.status_code == 200:
                        return None
                    last = f"/health answered {r.status_code}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if await asyncio.to_thread(self.target.is_up) is False:
                    why = getattr(self.target, "failure", lambda: None)()
                    return "the service is not running" + (f": {why}" if why else f" ({last})")
                await asyncio.sleep(READY_POLL_S)
        return f"production not ready after {timeout_s:.0f} s: {last}"

    # --- starting ------------------------------------------------------------------------------------
    async def start_on(self, flags: dict[str, Any], deployment: Any = None) -> str | None:
        """Write `flags` (unless live already) and (re)start production; None once it serves, else why not.
        `deployment` (the exporter's) heads the file with the certificate and the full run hint."""
        try:
            live = self.target.current()
            if (live or {}) != flags:
                # A live config production refused (it OOMed) must not become `.previous`.
                keep = live is None or self.refusals.refused(self.fingerprint(), live) is None
                await asyncio.to_thread(lambda: self.target.write(flags, deployment=deployment, keep_previous=keep))
        except DeployError as exc:
            return str(exc)
        if not self.target.can_take_down:  # writing is all it does: production restarts when a person says
            return await self.ready(self.startup_timeout_s)
        began = time.time()
        self.restarts_in_flight += 1
        try:
            await asyncio.to_thread(self.target.apply)
            return await self.ready(self.startup_timeout_s)
        except DeployError as exc:
            return str(exc)
        finally:
            self.restarts_in_flight -= 1
            self.counted_until = time.time()
            self.count_down(self.counted_until - began)

    def _candidates(self, first: dict[str, Any] | None, exclude: list[dict[str, Any]]) -> list[tuple[str, dict]]:
        seen = {flags_key(f) for f in exclude}
        out: list[tuple[str, dict[str, Any]]] = []
        fingerprint = self.fingerprint()
        for source, flags in ([("asked", first)] if first is not None else []) + \
                [("chain", k.flags) for k in self.chain.chain(self.box())]:
            key = flags_key(flags)
            if key in seen:
                continue
            seen.add(key)
            refused = self.refusals.refused(fingerprint, flags)
            if refused is not None and source == "chain":
                continue  # production refused it since it was good
            out.append((source, flags))
        return out

    async def bring_up(self, why: str, *, first: dict[str, Any] | None, exclude: list[dict[str, Any]] | None = None,
                       cycle_id: int | None = None) -> BringUp:
        """Production serving again on `first`, else on the newest known-good config that starts."""
        if not self.target.can_take_down:
            # Not ours to start (a file target without start/stop): say it is down, a person starts it.
            result = BringUp(False, tried=["the deploy target cannot start production (no start command)"])
            self._down(why, result, cycle_id)
            return result
        result = BringUp(False)
        # A production that answers but does not serve (its engine died, the API server lives on) still
        # holds its GPU memory: stop it before reading what is free.
        if await asyncio.to_thread(self.target.is_up) is not False:
            try:
                await asyncio.to_thread(self.target.stop)
            except DeployError as exc:
                result.tried.append(f"could not stop the failed production: {exc}")
        for source, flags in self._candidates(first, exclude or []):
            try:
                start_flags, fitted = fit_to_free(flags, await asyncio.to_thread(self.free_memory))
            except NotServingError as exc:
                result.tried.append(str(exc))
                break  # nothing fits what is free: a later try, after the other process left, may
            attempts = FIRST_ATTEMPTS if source == "asked" else 1
            problem: str | None = None
            try:
                async for attempt in AsyncRetrying(stop=stop_after_attempt(attempts), reraise=False,
                                                   wait=wait_exponential(multiplier=1, max=8),
                                                   retry=retry_if_exception_type(NotServingError)):
                    with attempt:
                        problem = await self.start_on(start_flags)
                        if problem is not None:
                            raise NotServingError(problem)
            except RetryError:
                pass
            if problem is None:
                result = BringUp(True, start_flags, source, fitted, result.tried)
                self._up(why, result, cycle_id)
                return result
            result.tried.append(f"{source} config failed: {problem}")
            log.warning("daemon.start_failed", why=why, source=source, problem=problem)
        self._down(why, result, cycle_id)
        return result

    def _up(self, why: str, result: BringUp, cycle_id: int | None) -> None:
        self.failures, self.next_try_at = 0, 0.0
        self.runtime.set(live_flags=result.flags, alarm=None)
        self.chain.record(result.flags or {}, self.box(), "restored", cycle_id=cycle_id)
        detail = {"why": why, "flags": result.flags, "source": result.source, "fitted": result.fitted,
                  "failed_first": result.tried}
        self.states.note("restored", detail, cycle_id)
        if result.fitted:
            self.states.note("fitted", {"note": result.fitted, "flags": result.flags}, cycle_id)
        self.notify("production-up", f"production serving again ({why})"
                    + (f"; {result.fitted}" if result.fitted else ""), detail)

    def _down(self, why: str, result: BringUp, cycle_id: int | None) -> None:
        self.failures += 1
        wait = min(300.0, 5.0 * 2 ** (self.failures - 1))
        self.next_try_at = time.time() + wait
        alarm = f"production is down and could not be brought back ({why}): {result.reason}"
        self.runtime.set(alarm=alarm[:4000])
        self.states.note("production-down", {"why": why, "tried": result.tried, "retry_in_s": wait}, cycle_id)
        log.error("daemon.production_down", why=why, tried=result.tried, retry_in_s=wait)
        self.notify("production-down", alarm, {"why": why, "tried": result.tried, "retry_in_s": wait})

    def restore_flags(self, live: dict[str, Any] | None) -> dict[str, Any] | None:
        """What to start production on when it is down: its live config, unless production refused that one
        (it OOMed): then the mitigation of it, else None (the known-good chain decides)."""
        if live is None or self.refusals.refused(self.fingerprint(), live) is None:
            return live
        return self.mitigation(live, None)[0]

    # --- emergencies -----------------------------------------------------------------------------------
    def mitigation(self, crashed: dict[str, Any], crash_tokens: int | None) -> tuple[dict[str, Any] | None, str]:
        """What to start after `crashed` died of `crash_tokens` in one step: the known-good config with the
        most certified headroom whose token budget is below the crashing step, else `crashed` with its budget
        lowered. (None, why) when neither exists."""
        step = crash_tokens or _int(crashed.get(BATCHED))
        better = []
        for k in self.chain.chain(self.box()):
            if flags_key(k.flags) == flags_key(crashed) or self.refusals.refused(self.fingerprint(), k.flags):
                continue
            budget = _int(k.flags.get(BATCHED))
            if step is not None and budget is not None and budget < step:
                better.append(k)
        if better:
            best = max(better, key=lambda k: (k.headroom_gib if k.headroom_gib is not None else -1.0,
                                              -(_int(k.flags.get(BATCHED)) or 0)))
            room = f"{best.headroom_gib:.1f} GiB certified headroom" if best.headroom_gib is not None else \
                "no certificate"
            return best.flags, (f"known-good config with max-num-batched-tokens {best.flags.get(BATCHED)} below the "
                                f"crashing step's {step} tokens ({room})")
        lowered = mitigated(crashed, crash_tokens)
        if lowered is None:
            return None, "the token budget cannot go lower"
        return lowered, (f"the crashed config with max-num-batched-tokens lowered {crashed.get(BATCHED, 'default')} "
                         f"→ {lowered[BATCHED]} (the crashing step scheduled {step} tokens)")


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
