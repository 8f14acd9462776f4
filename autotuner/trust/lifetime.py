"""One engine lifetime of confirmation: its replays recorded as confirm runs, the soak it may serve after
them, and the report confirmation (trust/confirm.py) and a back-off (trust/backoff.py) fill in."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import optuna
import structlog

from autotuner.analysis.evidence import Confirmation, SoakVerdict
from autotuner.analysis.study_data import StudyData
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord
from autotuner.trust import offload
from autotuner.trust.context import TrustContext
from autotuner.trust.record import record
from autotuner.trust.soak import record_soak, soak_scenario

log = structlog.get_logger(__name__)


@dataclass
class ConfirmReport:
    study: str
    candidates: list[int]
    runs: int
    references: list[int] = field(default_factory=list)  # baseline / current config, re-measured beside them
    # Those whose search run is one of their R lifetimes: the references, and the candidates when they are
    # every SLO-feasible configuration the search measured (none was picked for luck).
    counted: list[int] = field(default_factory=list)
    next_in_line: list[int] = field(default_factory=list)  # candidates confirmed after none of the first held up
    labels: dict[int, str] = field(default_factory=dict)  # "vLLM's defaults", "your current config"
    summaries: dict[int, Confirmation] = field(default_factory=dict)
    single_shot_best: int | None = None
    confirmed_best: int | None = None
    dropped: dict[int, str] = field(default_factory=dict)  # measured no more after a round, and why
    # Dropped, then the best once every one that beat it was refused on a bound: run to R starts after all.
    rejoined: list[int] = field(default_factory=list)
    # A configuration refused on its memory peak alone, re-tried with less utilization: the new trial → the
    # refused one (analysis/backoff.py). At most one per study.
    backed_off: dict[int, int] = field(default_factory=dict)
    lifetimes: int = 0  # engine starts (runs counts replays)
    replays: list[int] = field(default_factory=list)  # replays asked of each lifetime, per round
    split: dict[str, float] = field(default_factory=dict)  # objective → within-lifetime share of the spread
    # Soaks run on the engine of the last round's leader, after its confirmation replays (no start of their
    # own), in order: one, or a second when the first failed and a configuration dropped earlier rejoined;
    # none when not asked, or the runner cannot serve two workloads in a lifetime.
    soaked: list[SoakVerdict] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return None not in (self.single_shot_best, self.confirmed_best) and self.confirmed_best != self.single_shot_best


@dataclass(frozen=True)
class SoakPlan:
    scenario: Scenario
    text: str


def soak_plan(ctx: TrustContext, t: TrialRecord, soak_s: float) -> SoakPlan | None:
    """The soak `t`'s engine serves after its replays (None when the soak cannot be built: it says why on
    its own engine)."""
    flags = ctx.space.to_flags(ctx.space.clamp(t.flags))
    round_s = t.metrics.get("e2e_p95_s")
    try:
        scenario, text = soak_scenario(ctx.scenario, flags, soak_s,
                                       float(round_s) if isinstance(round_s, int | float) else None)
    except UserInputError:
        return None
    return SoakPlan(scenario, text)


async def measure_lifetime(ctx: TrustContext, study: optuna.Study, data: StudyData, report: ConfirmReport,
                           t: TrialRecord, rep: int, replays: int, budget: int, then: SoakPlan | None = None) -> None:
    """One engine lifetime of `t`'s configuration, its replays each recorded as a confirm run (`data`: the
    study as confirmation found it, for the offload check's reference footprints); with `then`, the soak
    on the same engine after them."""
    params = ctx.space.clamp(t.flags)
    flags = ctx.space.to_flags(params)
    ctx.on_event("trial", {"number": t.trial_number, "index": report.runs + 1, "budget": budget, "flags": flags,
                           "kind": "confirm"})
    started = time.time()
    results = await ctx.runner.run_lifetime(flags, replays, then=then.scenario if then is not None else None)
    report.lifetimes += 1
    soaked = results[replays] if then is not None and len(results) > replays else None
    results = results[:replays]
    # The weights were loaded once: one offload check per lifetime (it reads the engine's log).
    check = offload.check(results[0], data.trials, ctx.weights_gib)
    for k, result in enumerate(results):
        extra: dict[str, object] = {"lifetime": rep + 1, "replay": k + 1}
        if t.trial_number in report.counted:  # its search run then counts as a lifetime (evidence.py)
            extra["search_run"] = True
        if check is not None:
            extra["offload"] = check
        number = record(study, ctx.store, ctx.scenario, ctx.space, kind="confirm", original=t.trial_number,
                        params=params, result=result, started=started, extra=extra)
        started = time.time()
        report.runs += 1
        log.info("confirm.run", study=ctx.study_name, number=number, confirms=t.trial_number, repeat=rep + 1,
                 replay=k + 1, outcome=result.outcome, **{m: result.metrics.get(m) for m, _ in data.objectives},
                 peak_fraction=result.memory.get("peak_fraction"), offload=check and check.get("verified"))
        ctx.on_event("finished", {"number": number, "outcome": result.outcome, "state": "COMPLETE",
                                  "reason": result.reason, "flags": result.flags,
                                  "feasible": result.outcome == "ok",
                                  "values": [result.metrics.get(m) for m, _ in data.objectives]})
    if soaked is not None and then is not None:
        log.info("soak.after_confirm", study=ctx.study_name, original=t.trial_number, workload=then.text)
        report.soaked.append(record_soak(ctx, study, t.trial_number, flags, soaked, then.text, started,
                                         after_confirm=True))
