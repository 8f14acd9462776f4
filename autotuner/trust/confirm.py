"""Confirmation: re-measure the best candidates before calling one best.

The top K (the SLO-feasible Pareto front, then the feasible trials nearest to it) are measured R more
times each, interleaved A B C A B C … so that drift of the box hits all alike. vLLM's defaults and the
user's current config are re-measured alongside them (when they ran to the end), so that every
comparison a reader sees stands on intervals on both sides, never on a single lucky run. Each run is a trial of
kind `confirm` linked to its original; `summary.confirmations` turns them into intervals and
`analysis.confirmed` ranks by their bounds; when none of them holds up, the next K in the same order are
confirmed once more (PASSES). After each round, what another configuration already beats
beyond the noise is measured no more (analysis/racing.py): the confirmed best still gets every repeat.

Each repeat is an engine lifetime (a restart). In the first two rounds each lifetime replays the
workload up to `replays` times; later rounds replay only where those showed the spread to be within a
lifetime at least as much as between lifetimes (analysis/lifetimes.py), else every repeat is a restart.
Intervals and racing stand on lifetimes, a lifetime's figure being the mean of its replays.

A search run that nothing picked for being good is one of its configuration's R lifetimes
(analysis/evidence.py): a reference's (it was run for being the reference), and every candidate's when
the search measured no other SLO-feasible configuration, so that confirmation took them all and left
none out for being unlucky. Such a configuration gets R − 1 confirmation lifetimes, sitting out the last
round unless it leads among picked candidates. When every configuration raced is such a one, the race
has R − 1 rounds, the best's included (its engine of the last serving the soak), and the R-th only while
none leads.
"""

from __future__ import annotations

import math
from dataclasses import replace

import structlog

from autotuner.analysis.candidates import Analysis, analyse, choose
from autotuner.analysis.compare import reference_label, references
from autotuner.analysis.confirmed import confirmed_ranking
from autotuner.analysis.evidence import confirmations, soaks
from autotuner.analysis.lifetimes import replays_pay, split
from autotuner.analysis.racing import beaten
from autotuner.analysis.slo import combine
from autotuner.analysis.study_data import StudyData
from autotuner.store.db import TrialRecord
from autotuner.trials.scoring import DEFAULT_REPEATS, DEFAULT_REPLAYS, DEFAULT_TOP
from autotuner.trust.backoff import back_off
from autotuner.trust.context import TrustContext
from autotuner.trust.lifetime import ConfirmReport, SoakPlan, measure_lifetime, soak_plan

log = structlog.get_logger(__name__)


def pick(analysis: Analysis, top: int) -> list[TrialRecord]:
    """The SLO-feasible Pareto front (best first by the knee), then its nearest feasible neighbours,
    up to `top`; one trial per distinct configuration."""
    objectives = analysis.study.objectives
    front = list(analysis.front)
    ordered: list[TrialRecord] = []
    while front:
        part = Analysis(analysis.study, analysis.slos, front, front, front)
        best = choose("knee", part)
        assert best is not None
        ordered.append(best)
        front = [t for t in front if t is not best]
    rest = [t for t in analysis.candidates if t not in ordered]
    scale = {m: max((abs(float(t.metrics.get(m) or 0)) for t in analysis.candidates), default=1.0) or 1.0
             for m, _ in objectives}

    def distance(t: TrialRecord) -> float:
        return min((math.dist([float(t.metrics.get(m) or 0) / scale[m] for m, _ in objectives],
                              [float(f.metrics.get(m) or 0) / scale[m] for m, _ in objectives])
                    for f in ordered), default=0.0)

    ordered += sorted(rest, key=lambda t: (distance(t), t.trial_number))
    out: list[TrialRecord] = []
    seen: set[str] = set()
    for t in ordered:
        key = repr(sorted(t.flags.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def _leader(ctx: TrustContext, raced: list[TrialRecord], policy: str, provisional: bool = False) -> TrialRecord | None:
    """The confirmed best so far among `raced`: the only one left when the runs cannot rank yet.
    `provisional`: the best the round about to run should confirm, its peak bounds on the box's pooled
    spread alone, as their own spread on the starts so far cannot tell yet (soak host before round R)."""
    leader = _first(ctx, raced, policy, provisional)
    return raced[0] if leader is None and len(raced) == 1 else leader


def _first(ctx: TrustContext, raced: list[TrialRecord], policy: str, provisional: bool = False) -> TrialRecord | None:
    """The one of `raced` the confirmed ranking puts first; None while each is refused on a bound."""
    data = ctx.data()
    alive = {t.trial_number: t for t in raced}
    found = confirmations(data.trials)
    if provisional:
        found = {n: replace(c, peak_bound=c.peak_bound_pooled) if n in alive else c for n, c in found.items()}
    ranked = confirmed_ranking(policy, analyse(data, combine(data.scenario.slos, [])), found, soaks(data.trials))
    return next((alive[t.trial_number] for t in ranked if t.trial_number in alive), None)


def _leader_last(ctx: TrustContext, raced: list[TrialRecord], leader: TrialRecord | None,
                 soak_s: float) -> tuple[list[TrialRecord], SoakPlan | None]:
    """The round's order with the confirmed best so far last, and the soak its engine serves after its
    replays: when it holds, its verified lifetime is already under way."""
    if leader is None or leader not in raced:
        return raced, None
    plan = soak_plan(ctx, leader, soak_s)
    return ([t for t in raced if t is not leader] + [leader], plan) if plan is not None else (raced, None)


def _replays_after_two_rounds(ctx: TrustContext, report: ConfirmReport, measured: list[TrialRecord],
                              replays: int) -> int:
    """Keep replaying within lifetimes only where two rounds showed the spread to live there."""
    runs, metrics = _note_split(ctx, report, measured)
    keep = replays_pay(runs, metrics)
    log.info("confirm.replays", study=ctx.study_name, within_share=report.split, replays=replays if keep else 1,
             why="the spread is within a lifetime as much as between" if keep else
             "the spread is mostly between lifetimes (or not estimated): every repeat a restart")
    return replays if keep else 1


def _note_split(ctx: TrustContext, report: ConfirmReport,
                measured: list[TrialRecord]) -> tuple[list[TrialRecord], list[str]]:
    """The within-lifetime share of the spread per objective, as far as the runs so far tell, on the
    report; the runs and objectives it stands on."""
    data = ctx.data()
    originals = {t.trial_number for t in measured}
    runs = [t for t in data.trials if t.kind == "confirm" and t.result.get("confirms") in originals]
    metrics = [m for m, _ in data.objectives]
    for m in metrics:
        s = split(runs, m)
        if s is not None:
            report.split[m] = round(s.within_share, 3)
    return runs, metrics


def none_left_out(analysis: Analysis, confirmed: list[TrialRecord]) -> bool:
    """Whether confirmation takes every SLO-feasible configuration the search measured. Then none was
    picked from the others for a lucky run, and each one's search run is as good a lifetime as any
    confirmation run: the winner's curse needs a choice. What is left is the SLO cut itself; a
    configuration that met an SLO on a lucky run meets it again in its confirmed bound or loses."""
    chosen = {repr(sorted(t.flags.items())) for t in confirmed}
    return all(repr(sorted(t.flags.items())) in chosen for t in analysis.candidates)


def all_counted(measured: list[TrialRecord], counted: set[int]) -> bool:
    """Whether every configuration raced stands on its search run as one of its lifetimes. Their search
    runs were then all measured before the interleaving, so drift of the box between search and
    confirmation lands on none of them alone, and the best needs no confirmation start beyond R − 1."""
    return bool(measured) and all(t.trial_number in counted for t in measured)


def references_to_confirm(analysis: Analysis, chosen: list[TrialRecord]) -> list[TrialRecord]:
    """The user's current config and vLLM's defaults, when they ran to the end and are not already
    among the candidates (by configuration): the other side of every comparison."""
    taken = {repr(sorted(t.flags.items())) for t in chosen}
    out = []
    for t in references(analysis.study.trials):
        key = repr(sorted(t.flags.items()))
        if t.outcome == "ok" and t.state == "COMPLETE" and key not in taken:
            taken.add(key)
            out.append(t)
    return out


# When none of the first K holds up — each at the memory wall or an SLO's edge, as a search's best
# configurations often are — the next K in the same order are confirmed once more: a verified winner a
# little further from the edge is worth the starts, none is worth nothing to a user who has to deploy.
PASSES = 2


async def confirm(ctx: TrustContext, top: int = DEFAULT_TOP, repeats: int = DEFAULT_REPEATS,
                  policy: str = "knee", replays: int = DEFAULT_REPLAYS, soak_s: float | None = None) -> ConfirmReport:
    """`soak_s`: the last round measures the confirmed best so far last, and its engine then serves the
    soak for this long (soak.py): one engine start fewer when it stays the best."""
    data = ctx.data()
    analysis = analyse(data, combine(data.scenario.slos, []))
    ordered = pick(analysis, top * PASSES)
    candidates = ordered[:top]
    report = ConfirmReport(ctx.study_name, [], 0)
    if not candidates:
        log.warning("confirm.nothing", study=ctx.study_name, reason="no SLO-feasible trial to confirm")
        return report
    refs = references_to_confirm(analysis, candidates)
    report.references = [t.trial_number for t in refs]
    report.labels = {t.trial_number: reference_label(t) for t in refs}
    naive = choose(policy, analysis)
    report.single_shot_best = naive.trial_number if naive is not None else None
    per_lifetime = max(1, replays)
    confirmed: list[TrialRecord] = []
    for attempt in range(PASSES):
        if attempt:
            candidates, refs = ordered[top * attempt : top * (attempt + 1)], []
            if not candidates or report.confirmed_best is not None:
                break
            log.warning("confirm.next_candidates", study=ctx.study_name,
                        candidates=[t.trial_number for t in candidates],
                        why="none of the confirmed held up (each refused on a bound): the next in line are confirmed")
            report.next_in_line += [t.trial_number for t in candidates]
        report.candidates += [t.trial_number for t in candidates]
        confirmed += candidates + refs
        counted = [t.trial_number for t in refs] + (
            [t.trial_number for t in candidates] if none_left_out(analysis, confirmed) else [])
        report.counted += counted
        log.info("confirm.started", study=ctx.study_name, candidates=[t.trial_number for t in candidates],
                 references=[t.trial_number for t in refs], repeats=repeats, replays=replays,
                 search_run_counts=counted)
        per_lifetime = await _race(ctx, data, report, candidates + refs, set(counted), repeats, policy, per_lifetime,
                                   soak_s)
        if not report.backed_off:  # before a dropped one rejoins: the backed-off one may outrun it
            await back_off(ctx, report, repeats, policy, per_lifetime, soak_s)
        best = await _rejoin(ctx, report, confirmed, repeats, policy, per_lifetime, soak_s)
        report.confirmed_best = best.trial_number if best is not None else None
        data = ctx.data()
    if max(report.replays, default=1) > 1:
        _note_split(ctx, report, confirmed)  # what the replays showed, also when no later round needed it
    report.summaries = {n: c for n, c in confirmations(data.trials).items()
                        if n in report.candidates or n in report.references}
    if report.changed:
        log.warning("confirm.best_changed", study=ctx.study_name, single_shot_best=report.single_shot_best,
                    confirmed_best=report.confirmed_best,
                    note="the single-shot best did not hold up when re-measured")
    log.info("confirm.finished", study=ctx.study_name, runs=report.runs, confirmed_best=report.confirmed_best)
    return report


async def next_to_soak(ctx: TrustContext, report: ConfirmReport, repeats: int, policy: str,
                       soak_s: float) -> TrialRecord | None:
    """The configuration to soak now, on R lifetimes: the confirmed ranking's first, which changes when
    the best fails its soak. One that racing dropped runs the rounds it missed first, the last one's
    engine serving the soak, as when a bound refused the configurations ahead of it; without that, the
    soak would move on to a configuration certified on the one or two starts it had."""
    numbers = set(report.candidates) | set(report.references)
    measured = [t for t in ctx.data().trials if t.trial_number in numbers]
    return await _rejoin(ctx, report, measured, repeats, policy, report.replays[-1] if report.replays else 1, soak_s)


async def _rejoin(ctx: TrustContext, report: ConfirmReport, measured: list[TrialRecord], repeats: int, policy: str,
                  per_lifetime: int, soak_s: float | None) -> TrialRecord | None:
    """The confirmed best, on R lifetimes whatever racing did. Racing drops what another
    configuration beats on the objectives, and that one can still be refused later on a bound (its memory
    peak, an SLO, a failed start): then the dropped one can end best on the single start it had — a
    certificate on one engine lifetime. It rejoins for the rounds it missed, the last serving the soak,
    and the ranking is asked again (it may not hold up over them)."""
    by_number = {t.trial_number: t for t in measured}
    while True:
        data = ctx.data()
        found = confirmations(data.trials)
        ranked = confirmed_ranking(policy, analyse(data, combine(data.scenario.slos, [])), found, soaks(data.trials))
        best = ranked[0] if ranked else None
        if best is None or best.trial_number not in report.dropped or best.trial_number not in by_number:
            return best
        t, have = by_number[best.trial_number], found[best.trial_number].lifetimes
        # R confirmation starts; R − 1 where every search run counts (its own is the R-th lifetime).
        full = repeats - (repeats > 1 and all_counted(measured, set(report.counted)))
        if have >= full:
            return best
        why = report.dropped.pop(t.trial_number)
        report.rejoined.append(t.trial_number)
        log.info("confirm.rejoined", study=ctx.study_name, trial=t.trial_number, starts=have, dropped_because=why,
                 why="every configuration ahead of it was refused on a bound: it runs the rounds it missed")
        study = ctx.study()
        for rep in range(have, full):
            plan = soak_plan(ctx, t, soak_s) if soak_s and rep == full - 1 else None
            await measure_lifetime(ctx, study, data, report, t, rep, per_lifetime,
                                   report.lifetimes + full - rep, plan)


async def _race(ctx: TrustContext, data: StudyData, report: ConfirmReport, measured: list[TrialRecord],
                counted: set[int], repeats: int, policy: str, per_lifetime: int, soak_s: float | None) -> int:
    """R interleaved rounds of `measured`, racing after each; `counted`: those whose search run is one of
    their lifetimes. Returns the replays per lifetime the rounds ended on."""
    raced = now = list(measured)
    budget = repeats * (len(measured) - len(counted)) + max(1, repeats - 1) * len(counted)
    # When every search run counts, R − 1 rounds give each configuration its R lifetimes, the best's
    # included; its engine of the last of them serves the soak. The R-th round only while none leads.
    rounds = repeats - 1 if repeats > 1 and all_counted(measured, counted) else repeats
    study = ctx.study()
    for rep in range(repeats):
        if rep:
            out = beaten(ctx.data().trials, [t.trial_number for t in raced], counted, data.objectives)
            for number, why in out.items():
                report.dropped[number] = why
                log.info("confirm.dropped", study=ctx.study_name, trial=number, after_rounds=rep, why=why)
            raced = [t for t in raced if t.trial_number not in out]
        if rep >= rounds and _first(ctx, raced, policy) is not None:
            break
        if rep == 2 and per_lifetime > 1:
            per_lifetime = _replays_after_two_rounds(ctx, report, measured, per_lifetime)
        report.replays.append(per_lifetime)
        plan, last = None, rep >= rounds - 1
        now = raced
        leader = _leader(ctx, raced, policy) if rep >= max(1, repeats - 1) and counted else None
        if leader is not None:
            # A counted search run is the R-th lifetime, so its configuration sits out the last round; never
            # while it leads, in a race beside picked candidates: its search run was measured apart from
            # their interleaving, so the best stands on R confirmation starts whatever it is, and its engine
            # of the last round serves the soak. While none leads (each so far refused on a bound), every
            # one runs it: the start may bring one within its bound.
            now = [t for t in raced if t.trial_number not in counted or t is leader]
        if soak_s and last:
            now, plan = _leader_last(ctx, now, _leader(ctx, now, policy, provisional=rep < repeats - 1), soak_s)
        for t in now:  # interleaved: A B C A B C …
            await measure_lifetime(ctx, study, data, report, t, rep, per_lifetime, budget,
                                   plan if t is now[-1] else None)
    # One that sat out the last round and leads after it: the round it sat out, so that the best stands on
    # R confirmation starts (and serves the soak, when one was asked, as the leader would have).
    sat_out = [t for t in raced if t.trial_number in counted and t not in now]
    late = _leader(ctx, raced, policy) if sat_out and repeats > 1 else None
    if late is not None and late in sat_out:
        log.info("confirm.sat_out_leads", study=ctx.study_name, trial=late.trial_number,
                 why="it sat out the last round and leads after it: it runs that round too")
        budget += 1
        plan = soak_plan(ctx, late, soak_s) if soak_s else None
        await measure_lifetime(ctx, study, data, report, late, repeats - 1, per_lifetime, budget, plan)
    return per_lifetime


__all__ = ["DEFAULT_REPEATS", "DEFAULT_REPLAYS", "DEFAULT_TOP", "ConfirmReport", "confirm", "next_to_soak", "pick"]
