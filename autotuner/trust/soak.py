"""Soak: the chosen configuration under the worst workload the scenario allows, for long enough.

Every prompt at the longest length of the scenario's distribution (its `max`, else 3σ above the
middle; capped by max-model-len minus the longest output), every output at its longest, concurrency at
the scenario's peak or max-num-seqs, whichever is lower, and no shared prefix to lean on. Requests of
one length sent by a closed loop start and finish together, so every round is a burst of the longest
prefills. Measured by the same trial runner as the search (memory sampled all along). Pass: no OOM, no
failed request, peak under the threshold. A failure is recorded and the next confirmed candidate is
soaked instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
import structlog

from autotuner.analysis.candidates import analyse
from autotuner.analysis.confirmed import confirmed_ranking
from autotuner.analysis.evidence import SoakVerdict, confirmations, soaks
from autotuner.analysis.slo import combine
from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.scenario import LengthSettings, Scenario
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import threshold_of
from autotuner.trust.context import TrustContext
from autotuner.trust.record import record
from autotuner.tuner.replay_phase import peak_concurrency
from autotuner.vllm import FlagValue

log = structlog.get_logger(__name__)
DEFAULT_DURATION_S = 600.0
# A virtual-time soak runs at least this many rounds of the peak concurrency, and at most this many.
MIN_ROUNDS, MAX_ROUNDS = 2, 40
GIB = float(1 << 30)


@dataclass
class SoakReport:
    study: str
    verdicts: list[SoakVerdict] = field(default_factory=list)

    @property
    def passed(self) -> SoakVerdict | None:
        return next((v for v in self.verdicts if v.passed), None)


def longest(settings: LengthSettings) -> int:
    if settings.kind == "fixed":
        raw = float(settings.value or 1)
    elif settings.kind == "uniform":
        raw = float(settings.high or 1)
    elif settings.kind == "normal":
        raw = float(settings.mean or 1) + 3 * float(settings.stddev or 0)
    else:
        raw = float(settings.median or 1) * math.exp(3 * float(settings.sigma or 0))
    n = max(1, settings.min, round(raw))
    return n if settings.max is None else min(n, settings.max)


def _engine_limits(scenario: Scenario, flags: Mapping[str, FlagValue]) -> tuple[int | None, int | None]:
    """(max-model-len, max-num-seqs) the engine will run with, where we can know them."""
    merged = {**scenario.engine.flags, **flags}
    mml = merged.get("max-model-len")
    seqs = merged.get("max-num-seqs")
    if mml is None or seqs is None:
        default_mml, default_seqs = backend_for(scenario).default_limits(scenario, merged)
        mml = mml if mml is not None else default_mml
        seqs = seqs if seqs is not None else default_seqs
    return (int(mml) if isinstance(mml, int | float) else None, int(seqs) if isinstance(seqs, int | float) else None)


def soak_scenario(scenario: Scenario, flags: Mapping[str, FlagValue], duration_s: float,
                  round_s: float | None = None) -> tuple[Scenario, str]:
    """The scenario with its workload replaced by the worst one it allows, and a line saying which."""
    r = scenario.workload.requests
    mml, seqs = _engine_limits(scenario, flags)
    if r.kind == "trace":
        if mml is None:
            raise UserInputError("soak of a trace workload: set engine.flags.max-model-len so the longest prompt "
                                 "is known")
        out_len, prompt = 256, mml - 256
    else:
        out_len = longest(r.output_tokens)
        prompt = longest(r.prompt_tokens)
        if mml is not None:
            prompt = min(prompt, mml - out_len)
    if prompt < 1:
        raise UserInputError(f"soak: max-model-len {mml} leaves no room for a prompt before {out_len} output tokens")
    peak = peak_concurrency(scenario)
    concurrency = min(peak, seqs) if seqs else peak
    if not backend_for(scenario).runs_process:
        # Virtual time has no deadline to stop at: size the run in rounds of the peak concurrency.
        rounds = MAX_ROUNDS if not round_s else max(MIN_ROUNDS, min(MAX_ROUNDS, math.ceil(duration_s / round_s)))
        count, max_duration = concurrency * rounds, None
    else:
        count, max_duration = concurrency * MAX_ROUNDS * 5, duration_s
    workload = scenario.workload.model_copy(update={
        "requests": r.model_copy(update={
            "kind": "synthetic", "count": count, "path": None, "shared_prefix_tokens": 0,
            "shared_prefix_fraction": 0.0,
            "prompt_tokens": LengthSettings(kind="fixed", value=prompt),
            "output_tokens": LengthSettings(kind="fixed", value=out_len)}),
        "arrivals": scenario.workload.arrivals.model_copy(update={"kind": "concurrency",
                                                                  "concurrency": concurrency}),
        "max_requests": None, "max_duration_s": max_duration, "ignore_eos": True})
    text = (f"{count if max_duration is None else 'up to ' + str(count)} prompts of {prompt} tokens → {out_len} "
            f"tokens, concurrency {concurrency} (peak {peak}"
            + (f", max-num-seqs {seqs}" if seqs else "") + ")"
            + (f", for {max_duration:g} s" if max_duration else ""))
    return scenario.model_copy(update={"workload": workload}), text


def verdict_of(result: TrialResult, scenario: Scenario, original: int, workload: str) -> dict[str, Any]:
    m, mem = result.metrics, result.memory
    failed = int(m.get("failed") or 0)
    peaks = [int(b) for b in mem.get("peak_bytes") or []]  # type: ignore[union-attr]
    totals_raw = mem.get("total_bytes")
    totals = [int(b) for b in totals_raw] if isinstance(totals_raw, list) else [int(totals_raw or 0)] * len(peaks)
    limit = threshold_of(scenario)
    peak = mem.get("peak_fraction")
    if result.outcome != Outcome.OK:
        passed, reason = False, f"{result.outcome}: {result.reason}"
    elif failed:
        passed, reason = False, f"{failed} request(s) failed: {result.reason}"
    elif any(p >= limit.limit_bytes(t) for p, t in zip(peaks, totals, strict=False)):
        passed, reason = False, f"memory peak {float(peak or 0):.1%} reached the OOM threshold"
    else:
        passed, reason = True, None
    return {"trial": -1, "original": original, "passed": passed, "reason": reason,
            "duration_s": m.get("duration_s") or result.duration_s or None,
            "peak_fraction": peak, "ttft_p99_s": m.get("ttft_p99_s"), "itl_p99_s": m.get("itl_p99_s"),
            "workload": workload,
            "headroom_gib": [round((t - p) / GIB, 3) for p, t in zip(peaks, totals, strict=False)],
            "finished_at": time.time()}


async def soak(ctx: TrustContext, duration_s: float = DEFAULT_DURATION_S, flags: Mapping[str, FlagValue] | None = None,
               policy: str = "knee", tries: int = 3) -> SoakReport:
    """Soak the best confirmed candidate; on failure the next one, up to `tries`. With `flags`, soak
    exactly those (linked to the trial that ran them, if one did)."""
    data = ctx.data()
    report = SoakReport(ctx.study_name)
    if flags is not None:
        merged = {**ctx.scenario.engine.flags, **flags}
        match = next((t for t in data.trials if t.kind not in ("confirm", "soak") and t.flags == merged), None)
        queue: list[tuple[int, dict[str, FlagValue], TrialRecord | None]] = [
            (match.trial_number if match else -1, dict(flags), match)]
    else:
        analysis = analyse(data, combine(data.scenario.slos, []))
        ranked = confirmed_ranking(policy, analysis, confirmations(data.trials), soaks(data.trials))
        if not ranked:
            raise UserInputError(f"study {ctx.study_name} has no confirmed candidate that holds: run `autotuner "
                                 f"confirm --study {ctx.study_name}` first (or soak given flags with --set)")
        queue = [(t.trial_number, ctx.space.to_flags(ctx.space.clamp(t.flags)), t) for t in ranked[:tries]]
    study = ctx.study()
    for original, candidate, trial in queue:
        round_s = trial.metrics.get("e2e_p95_s") if trial is not None else None
        scenario, text = soak_scenario(ctx.scenario, candidate, duration_s,
                                       float(round_s) if isinstance(round_s, int | float) else None)
        runner = ctx.make_runner(scenario)
        ctx.on_event("trial", {"number": original, "index": len(report.verdicts) + 1, "budget": len(queue),
                               "flags": candidate, "kind": "soak"})
        log.info("soak.started", study=ctx.study_name, original=original, workload=text, duration_s=duration_s)
        started = time.time()
        result = await runner.run(candidate)
        v = record_soak(ctx, study, original, candidate, result, text, started)
        report.verdicts.append(v)
        if v.passed:
            break
        log.warning("soak.failed", study=ctx.study_name, original=original, reason=v.reason,
                    note="the next confirmed candidate is soaked instead" if flags is None else None)
    return report


def record_soak(ctx: TrustContext, study: optuna.Study, original: int, candidate: Mapping[str, FlagValue],
                result: TrialResult, workload: str, started: float, after_confirm: bool = False) -> SoakVerdict:
    """The soak run as a trial of kind `soak` with its verdict (`after_confirm`: on the engine of the
    configuration's last confirmation run, not one of its own)."""
    verdict = {**verdict_of(result, ctx.scenario, original, workload), "after_confirm": after_confirm}
    params = ctx.space.clamp({**ctx.scenario.engine.flags, **candidate})
    number = record(study, ctx.store, ctx.scenario, ctx.space, kind="soak", original=original, params=params,
                    result=result, started=started, extra={"soak": verdict})
    v = SoakVerdict(**{**verdict, "trial": number})
    log.info("soak.finished", study=ctx.study_name, number=number, original=original, passed=v.passed,
             reason=v.reason, peak_fraction=v.peak_fraction, headroom_gib=v.headroom_gib,
             ttft_p99_s=v.ttft_p99_s, itl_p99_s=v.itl_p99_s, duration_s=v.duration_s, after_confirm=after_confirm)
    ctx.on_event("finished", {"number": number, "outcome": result.outcome, "state": "COMPLETE",
                              "reason": v.reason, "flags": result.flags, "feasible": v.passed,
                              "values": [result.metrics.get(o.metric) for o in ctx.scenario.objectives]})
    return v
