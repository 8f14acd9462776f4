"""What the poll (loop.py) adopts rather than tunes for: production at first sight (the reference triggers
compare with), a restart by a person, and a person's edit of the live config file. Not the fleet's adoption
of its group's winner (fleet/coordinator.py, ADOPT_TRIGGER).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotuner.daemon.fingerprints import box_fingerprint
from autotuner.daemon.triggers import CRASH, Trigger, identity
from autotuner.watch.fingerprint import model_fingerprint
from autotuner.watch.snapshot import GpuInfo, ProductionSnapshot

if TYPE_CHECKING:
    from autotuner.daemon.loop import Daemon


def adopt(daemon: Daemon, snap: ProductionSnapshot, gpus: tuple[GpuInfo, ...]) -> dict[str, Any]:
    """First sight of production: it becomes the reference, except for a model other than the
    scenario's, which counts as a swap from the scenario's model. What it runs is the first
    known-good config."""
    ref = identity(snap, gpus)
    scenario = daemon.loaded.scenario
    tuned = model_fingerprint(scenario.engine.model, scenario.engine.served_model_name or snap.served_model)
    if tuned is not None and snap.root != scenario.engine.model:
        ref.update(model_fingerprint=tuned, root=scenario.engine.model)
    daemon.states.set_reference(ref)
    live = daemon.target.current()
    if live is not None:
        daemon.chain.record(live, box_fingerprint(ref), "adopted")
        daemon.runtime.set(live_flags=live)
    daemon.states.note("adopted", {"reference": ref})
    return ref


def manual_restarts(daemon: Daemon, fired: list[Trigger], snap: ProductionSnapshot) -> list[Trigger]:
    """A restart nobody crashed (counters back to zero, no OOM line, serving again): a person's. Noted and
    adopted, not a reason to re-tune."""
    out = []
    for t in fired:
        if t.kind == CRASH and snap.reachable and "restarted" in str(t.evidence.get("error", "")):
            daemon.states.note("manual-restart", {"evidence": t.evidence, "action": "adopted"})
            continue
        out.append(t)
    return out


def check_hand_edit(daemon: Daemon) -> None:
    """The live file differs from what the daemon last put live: a person edited it. Adopted as the live
    config (the daemon's rollbacks start from it); it joins the known-good chain only once production
    has verified on it, which a restart by the daemon does."""
    rt = daemon.runtime.get()
    try:
        live = daemon.target.current()
    except Exception as exc:
        daemon.states.note("conflict", {"error": str(exc)})
        return
    if rt.live_flags is None or live is None or live == rt.live_flags:
        return
    daemon.states.note("hand-edit", {"before": rt.live_flags, "after": live,
                                     "action": "adopted as the live config; known-good once production verified "
                                               "on it"})
    daemon.runtime.set(live_flags=live)
