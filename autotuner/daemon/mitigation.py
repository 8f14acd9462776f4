"""Production kept serving, at every poll (loop.py): down, it is brought back at once whatever the window says;
after an OOM, on a config with more headroom for the step that crashed (the emergency mitigation). Only the
re-tune waits for the window.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from autotuner.daemon.health import DOWN_GRACE_S
from autotuner.daemon.refusals import OOM as OOM_REFUSAL
from autotuner.daemon.triggers import CRASH, OOM, Trigger
from autotuner.watch.snapshot import ProductionSnapshot

if TYPE_CHECKING:
    from autotuner.daemon.loop import Daemon


async def keep_serving(daemon: Daemon, snap: ProductionSnapshot, fired: list[Trigger]) -> None:
    """Production down: bring it back now, whatever the window says (an OOM: on a config with more
    headroom). A failed bring-up is retried with backoff at later polls."""
    if snap.reachable and await daemon.keeper.healthy():
        daemon.health.down_seen_at = None
        return
    now = time.time()
    crash = next((t for t in fired if t.kind in (OOM, CRASH)), None)
    target_down = await asyncio.to_thread(daemon.target.is_up) is False
    if target_down and daemon.health.down_seen_at is None:
        daemon.health.down_seen_at = now
    # A person's restart (stop, then start) is over within seconds: only a service still down after
    # DOWN_GRACE_S is ours to start, so that the two starts do not race.
    seen = daemon.health.down_seen_at
    target_down = target_down and seen is not None and now - seen >= DOWN_GRACE_S
    retry_due = daemon.runtime.get().alarm is not None and now >= daemon.keeper.next_try_at
    if crash is None and not target_down and not retry_due:
        return  # maybe a restart by a person: the crash trigger fires after the grace
    if daemon.keeper.next_try_at and time.time() < daemon.keeper.next_try_at:
        return
    live = daemon.target.current()
    if crash is not None and crash.kind == OOM and live is not None:
        await mitigate(daemon, live, crash)
        return
    first = daemon.keeper.restore_flags(live)
    await daemon.keeper.bring_up(f"production down ({crash.kind if crash else 'not running'})", first=first,
                                 exclude=[live] if live is not None and first != live else [])


async def mitigate(daemon: Daemon, crashed: dict[str, Any], trigger: Trigger) -> None:
    """An OOM in production: never again this config for this workload, and back up at once on one
    with more headroom for the step that crashed."""
    evidence = trigger.evidence
    prompts = [int(n) for n in evidence.get("crash_prompts") or [] if isinstance(n, int | float)]
    step = evidence.get("crash_step_tokens")
    crash_tokens = int(step) if isinstance(step, int | float) else (sum(prompts) if prompts else None)
    daemon.refusals.record(daemon.box(), crashed, OOM_REFUSAL,
                           "CUDA OOM in production: " + "; ".join(evidence.get("lines") or [])[:500])
    daemon.chain.forget(crashed, daemon.box())
    flags, why = daemon.keeper.mitigation(crashed, crash_tokens)
    detail = {"trigger": trigger.kind, "crashed": crashed, "mitigation": flags, "why": why,
              "crash_tokens": crash_tokens}
    daemon.states.note("mitigation", detail)
    daemon.notify("mitigation", f"emergency mitigation after a production OOM: {why}", detail)
    result = await daemon.keeper.bring_up("emergency mitigation after a production OOM", first=flags,
                                          exclude=[crashed])
    if result.ok:
        daemon.states.note("mitigated", {"flags": result.flags, "source": result.source})
