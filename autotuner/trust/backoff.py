"""Running a back-off (analysis/backoff.py says which and by how much): the configuration refused on its
memory peak alone, its flags at less utilization, measured and confirmed in its place during
confirmation (trust/confirm.py)."""

from __future__ import annotations

import math
import time

import optuna
import structlog

from autotuner.analysis.backoff import first_but_for_peaks, worth_backing_off
from autotuner.analysis.candidates import analyse
from autotuner.analysis.confirmed import confirmed_ranking
from autotuner.analysis.evidence import confirmations, soaks
from autotuner.analysis.racing import beaten
from autotuner.analysis.slo import combine
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import TRUST_KINDS, TrialKind
from autotuner.trust.context import TrustContext
from autotuner.trust.lifetime import ConfirmReport, measure_lifetime, soak_plan
from autotuner.trust.record import record
from autotuner.vllm.flags import UTILIZATION

log = structlog.get_logger(__name__)

# The most utilization a backed-off configuration gives up: at the wall by a point or two, the same flags
# keep nearly all of their speed; a peak bound further out says the peaks spread widely, and a configuration
# that far below is one the search could have measured itself.
MAX_BACKOFF = 0.03


async def back_off(ctx: TrustContext, report: ConfirmReport, repeats: int, policy: str, per_lifetime: int,
                   soak_s: float | None) -> bool:
    """When the configuration that would be the confirmed best but for its memory peak bound is refused on
    that alone: the same flags with utilization lowered by the bound's excess (rounded up to the space's
    step), measured and confirmed — its first run one of its R lifetimes, as nothing picked it for a lucky
    run — racing the confirmed best so far, its last engine serving the soak when it leads. Whether it ran."""
    data = ctx.data()
    plan = worth_backing_off(data, policy)
    params = _lowered(ctx, plan.trial, plan.excess) if plan is not None else None
    if plan is None or params is None:
        return False
    same = next((t for t in data.trials if t.kind not in TRUST_KINDS and ctx.space.clamp(t.flags) == params), None)
    if same is not None and same.trial_number in confirmations(data.trials):
        return False  # already confirmed: the ranking has had its say
    log.info("confirm.backoff", study=ctx.study_name, refused=plan.trial.trial_number, peak_bound=plan.peak_bound,
             threshold=plan.threshold, utilization=params[UTILIZATION],
             measured=same.trial_number if same is not None else None,
             why="the best but for its memory peak bound: the same flags with less KV cache stand under the wall")
    study = ctx.study()
    budget = report.lifetimes + repeats
    if same is None:
        flags = ctx.space.to_flags(params)
        ctx.on_event("trial", {"number": None, "index": report.lifetimes + 1, "budget": budget, "flags": flags,
                               "kind": TrialKind.BACKOFF})
        started = time.time()
        result = (await ctx.runner.run_lifetime(flags, 1))[0]
        report.lifetimes += 1
        report.runs += 1
        number = record(study, ctx.store, ctx.scenario, ctx.space, kind=TrialKind.BACKOFF,
                        original=plan.trial.trial_number, params=params, result=result, started=started,
                        extra={"peak_bound": plan.peak_bound, "threshold": plan.threshold})
        ctx.on_event("finished", {"number": number, "outcome": result.outcome, "state": "COMPLETE",
                                  "reason": result.reason, "flags": result.flags, "feasible": result.outcome == "ok",
                                  "values": [result.metrics.get(m) for m, _ in data.objectives]})
        data = ctx.data()
        same = next(t for t in data.trials if t.trial_number == number)
    t = same
    report.backed_off[t.trial_number] = plan.trial.trial_number
    analysis = analyse(data, combine(data.scenario.slos, []))
    if t.trial_number not in {c.trial_number for c in analysis.candidates}:
        log.info("confirm.backoff_refused", study=ctx.study_name, trial=t.trial_number, outcome=t.outcome,
                 why="its first run is not a candidate (see its reason)")
        return True
    report.candidates.append(t.trial_number)
    report.counted.append(t.trial_number)
    ranked = confirmed_ranking(policy, analysis, confirmations(data.trials), soaks(data.trials))
    rivals = [t.trial_number] + ([ranked[0].trial_number] if ranked else [])
    counted = {n for n in rivals if n in report.counted}
    for rep in range(max(1, repeats - 1)):
        if rep:
            out = beaten(ctx.data().trials, rivals, counted, data.objectives)
            if t.trial_number in out:
                report.dropped[t.trial_number] = out[t.trial_number]
                log.info("confirm.dropped", study=ctx.study_name, trial=t.trial_number, after_rounds=rep + 1,
                         why=out[t.trial_number])
                return True
        # Its last engine serves the soak when it leads but for its memory peak: at two lifetimes its own
        # peak bound cannot stand yet (t at one degree of freedom). A soak it then does not need costs
        # time, not a start; one it would need, when it trailed, costs a start of its own.
        soak = None
        if soak_s and rep == repeats - 2 and first_but_for_peaks(ctx.data(), policy, {t.trial_number}) == rivals[0]:
            soak = soak_plan(ctx, t, soak_s)
        await measure_lifetime(ctx, study, data, report, t, rep, per_lifetime, budget, soak)
    return True


def _lowered(ctx: TrustContext, trial: TrialRecord, excess: float) -> dict[str, object] | None:
    """`trial`'s params with utilization lowered by `excess` rounded up to the space's step (at least one
    step); None when the space has no utilization, or the result leaves its range or MAX_BACKOFF."""
    dist = ctx.space.distributions.get(UTILIZATION)
    params = ctx.space.clamp(trial.flags)
    if not isinstance(dist, optuna.distributions.FloatDistribution) or UTILIZATION not in params:
        return None
    step = dist.step or 0.01
    by = max(1, math.ceil(excess / step - 1e-6)) * step
    lower = round(float(params[UTILIZATION]) - by, 6)
    if lower < dist.low - 1e-9 or by > MAX_BACKOFF + 1e-9:
        log.info("confirm.no_backoff", study=ctx.study_name, trial=trial.trial_number, utilization=lower,
                 why="below the space's range" if lower < dist.low - 1e-9 else
                 f"more than {MAX_BACKOFF:.2f} of utilization: not a configuration at the wall any more")
        return None
    return {**params, UTILIZATION: lower}
