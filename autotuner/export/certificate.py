"""The evidence that travels with every exported config: which study and trial it came from, what that
trial measured, how close to the OOM wall it ran on each GPU, what it was measured on, and how the
defaults fared on the same workload. Comments in text formats, a key in JSON.
"""

from __future__ import annotations

import datetime as dt
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner import __version__
from autotuner.analysis.selection import Selection
from autotuner.analysis.study_data import StudyData
from autotuner.backends import backend_for
from autotuner.scenario import LengthSettings, Scenario
from autotuner.sim.accuracy import SIM_ACCURACY
from autotuner.store.db import TrialRecord
from autotuner.trials import memory_margin
from autotuner.trials.offload_axis import from_flags
from autotuner.trials.scoring import threshold_of
from autotuner.units import GIB, percent, rate, seconds

# The figures a deployer asks about first, in the order they are shown.
CERTIFIED_METRICS = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p95_s",
                     "tpot_p50_s", "itl_p99_s", "e2e_p95_s", "completed", "failed")
BASELINE_LABEL = "baseline (vLLM defaults)"


@dataclass
class GpuHeadroom:
    index: int
    peak_gib: float
    total_gib: float
    headroom_gib: float
    headroom_pct: float
    threshold_gib: float  # where the tuner would have stopped the engine


@dataclass
class BaselineComparison:
    trial: int
    outcome: str
    reason: str | None
    metrics: dict[str, float | int | None]
    peak_fraction: float | None


@dataclass
class Verification:
    """What was verified before export: re-measurement, soak, offload, and under which noise."""

    confirmation: dict[str, Any] | None  # runs, 95 % intervals, worst memory peak
    soak: dict[str, Any] | None  # passed, duration, workload, peak, p99 TTFT/ITL, headroom per GPU
    offload: dict[str, Any] | None  # None: no offload asked
    simulator_noise: float | None  # run-to-run CV of the simulator the figures come from
    unverified: list[str] = field(default_factory=list)  # what was missing, exported with --allow-unverified
    single_shot_best: int | None = None  # when the confirmed choice differs from the single-shot one

    def lines(self) -> list[str]:
        out = []
        c = self.confirmation
        if c is None:
            out.append("confirmed: no (single measurement)")
        else:
            iv = c["intervals"]
            parts = [f"{name} {_interval(iv.get(metric), unit)}" for metric, name, unit in (
                ("output_tokens_per_s", "output", "tok/s"), ("ttft_p95_s", "TTFT p95", "s"),
                ("itl_p99_s", "ITL p99", "s")) if iv.get(metric)]
            peak = c.get("worst_peak_fraction")
            starts = c.get("lifetimes") or len(c["runs"])
            out.append(f"confirmed: {len(c['runs'])} re-measurements on {starts} engine starts, intervals over the "
                       f"starts (trials {', '.join(map(str, c['runs']))}): "
                       + "; ".join(parts) + f"; worst memory peak {percent(peak)}")
            ahead = c.get("next_run") or {}
            ranges = [f"{name} {ahead[metric]['low']:.4g}–{ahead[metric]['high']:.4g} {unit}"
                      for metric, name, unit in (("output_tokens_per_s", "output", "tok/s"),
                                                 ("ttft_p95_s", "TTFT p95", "s")) if ahead.get(metric)]
            if ranges:
                out.append("one later run of it (`autotuner verify`) falls in (95 %): " + "; ".join(ranges))
        if self.single_shot_best is not None:
            out.append(f"the single-shot best, trial {self.single_shot_best}, did not hold up when re-measured")
        s = self.soak
        if s is None:
            out.append("soak: not run")
        else:
            room = min(s.get("headroom_gib") or [0.0])
            out.append(f"soak: {'passed' if s['passed'] else 'FAILED'} (trial {s['trial']}"
                       + (", on the engine of its last confirmation run" if s.get("after_confirm") else "") + "), "
                       f"{seconds(s.get('duration_s'))} of {s['workload']}; peak {percent(s.get('peak_fraction'))}, "
                       f"least headroom {room:.2f} GiB, TTFT p99 {seconds(s.get('ttft_p99_s'))}, "
                       f"ITL p99 {seconds(s.get('itl_p99_s'))}" + (f" — {s['reason']}" if s.get("reason") else ""))
        if self.offload is not None:
            state = {True: "verified", False: "NOT verified", None: "unchecked"}[self.offload.get("verified")]
            out.append(f"offload: {state}: {self.offload.get('reason')}")
        if self.simulator_noise is not None:
            out.append(f"simulator noise: {self.simulator_noise:.1%} run-to-run (coefficient of variation)")
        out += [f"UNVERIFIED (exported with --allow-unverified): missing {m}" for m in self.unverified]
        return out


def _interval(iv: dict[str, Any] | None, unit: str) -> str:
    if not iv:
        return "-"
    return f"mean {iv['mean']:.4g} {unit} (95 % CI {iv['low']:.4g}–{iv['high']:.4g}, n={iv['n']})"


@dataclass
class Certificate:
    study: str
    trial: int
    kind: str
    policy: str
    slos: list[str]
    measured_at: str
    metrics: dict[str, float | int | None]
    peak_fraction: float | None
    memory: list[GpuHeadroom]
    oom_threshold: str
    engine_version: str
    gpu_inventory: list[str]
    model: str
    model_fingerprint: str
    workload_fingerprint: str
    workload: str
    baseline: BaselineComparison | None
    simulator: str | None
    # What `metrics` are: "mean of 3 re-measurements, simulated-hardware time" or "one run, wall-clock time".
    basis: str = ""
    # Against the user's current config and vLLM's defaults (analysis.compare), and what to do about it.
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    recommendation: str | None = None
    target: list[str] = field(default_factory=list)
    verification: Verification | None = None
    autotuner_version: str = __version__
    foreign: str | None = None  # other processes' memory the trial was measured beside
    twin: str | None = None  # the study's twin: its finalists' error on this box (autotuner.twin)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """Plain sentences, one fact a line, for comment blocks."""
        m = self.metrics
        out = [
            f"autotuner certificate: study {self.study}, trial {self.trial} ({self.kind}), policy {self.policy}, "
            f"measured {self.measured_at}",
            *([f"RECOMMENDATION: {self.recommendation}"] if self.recommendation else []),
            f"SLOs: {'; '.join(self.slos) if self.slos else 'none'}",
            f"measured ({self.basis or 'one run'}):",
            f"  output {rate(m.get('output_tokens_per_s'))}, TTFT p50 {seconds(m.get('ttft_p50_s'))} / "
            f"p95 {seconds(m.get('ttft_p95_s'))}, TPOT p50 {seconds(m.get('tpot_p50_s'))}, "
            f"e2e p95 {seconds(m.get('e2e_p95_s'))}, {m.get('completed', '-')} completed / "
            f"{m.get('failed', '-')} failed",
            f"memory peak: {percent(self.peak_fraction)} of the fullest GPU; OOM threshold: {self.oom_threshold}",
        ]
        out += [f"  GPU {g.index}: peak {g.peak_gib:.2f} GiB of {g.total_gib:.2f} GiB, headroom "
                f"{g.headroom_gib:.2f} GiB ({g.headroom_pct:.1f} %), threshold {g.threshold_gib:.2f} GiB"
                for g in self.memory]
        if self.foreign:
            out.append(self.foreign)
        out += [
            f"engine: vLLM {self.engine_version}",
            f"GPUs: {inventory_summary(self.gpu_inventory)}",
            f"model: {self.model} (fingerprint {self.model_fingerprint})",
            f"workload: {self.workload} (fingerprint {self.workload_fingerprint})",
        ]
        out += ([f"this config: {c['sentence']}" for c in self.comparisons] if self.comparisons
                else [baseline_line(self.baseline)])
        if self.simulator:
            out.append(f"simulator: {self.simulator}")
        if self.twin:
            out.append(f"twin: {self.twin}")
        if self.verification is not None:
            out += self.verification.lines()
        out += [f"target: {note}" for note in self.target]
        out.append(f"autotuner {self.autotuner_version}")
        return out


def build_certificate(selection: Selection, target: list[str], allow_unverified: bool = False) -> Certificate:
    study = selection.study
    chosen = selection.chosen
    key = study.record.key
    certificate = Certificate(
        study=study.name, trial=chosen.trial_number, kind=chosen.kind, policy=selection.policy,
        slos=[s.describe() + (" (scenario)" if s.source == "scenario" else "") for s in selection.analysis.slos],
        measured_at=dt.datetime.fromtimestamp(chosen.finished_at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        metrics=certified_metrics(chosen), peak_fraction=chosen.memory.get("peak_fraction"),
        memory=headroom(chosen, study.scenario), oom_threshold=threshold_text(study.scenario),
        engine_version=key.engine_version, gpu_inventory=list(key.gpu_inventory), model=study.scenario.engine.model,
        model_fingerprint=key.model_fingerprint, workload_fingerprint=key.workload_fingerprint,
        workload=workload_text(study.scenario), baseline=_baseline(selection.baseline),
        simulator=simulator_note(study, chosen), target=list(target), foreign=foreign_line(chosen),
        verification=verification(selection, allow_unverified),
        comparisons=[c.to_dict() for c in selection.comparisons], recommendation=recommendation(selection),
        twin=twin_note(study),
    )
    c = selection.confirmation
    certificate.basis = f"{time_basis(study)}; " + (
        f"mean of {max(iv.n for iv in c.intervals.values())} re-measurements (engine starts; a start's figure is "
        "the mean of its replays), worst memory peak of all runs"
        if c is not None and c.intervals else "one run, not re-measured")
    if c is not None:  # the claim is the re-measured mean, not the lucky shot
        for metric, iv in c.intervals.items():
            if metric in certificate.metrics:
                certificate.metrics[metric] = iv.mean
        certificate.peak_fraction = c.worst_peak_fraction
    return certificate


def recommendation(selection: Selection) -> str | None:
    """Keep the reference when nothing found beats it (None when the exported config is the advice)."""
    first = selection.comparisons[0] if selection.comparisons else None
    if first is None or not first.keep_reference:
        return None
    if first.reference == selection.chosen.trial_number:
        return f"keep {first.label}: it is the best configuration found (trial {first.reference})"
    return (f"keep {first.label} (trial {first.reference}): this config is not significantly better; "
            "deploy it only for its other differences")


def time_basis(study: StudyData) -> str:
    """Which clock the figures were measured on: a simulator's figures are not the box's wall clock."""
    backend = backend_for(study.scenario)
    if not backend.simulated:
        return "wall-clock time on the box"
    return "simulated-hardware time" if backend.runs_process else "simulated, virtual time"


def verification(selection: Selection, allow_unverified: bool) -> Verification:
    scenario = selection.study.scenario
    c = selection.confirmation
    return Verification(
        confirmation=c.to_dict() if c is not None else None,
        soak=selection.soak.to_dict() if selection.soak is not None else None,
        offload=c.offload if c is not None and c.offload is not None else (
            {"verified": None, "reason": "never checked"} if from_flags(selection.chosen.flags, None)[0] != "none"
            else None),
        simulator_noise=scenario.engine.sim.noise if selection.study.simulated else None,
        unverified=list(selection.missing) if allow_unverified else [],
        single_shot_best=selection.single_shot.trial_number if selection.single_shot is not None else None)


def foreign_line(trial: TrialRecord) -> str | None:
    """The foreign baseline as a condition: the margins hold only while others hold no more."""
    foreign = trial.memory.get("foreign")
    if not isinstance(foreign, list):
        return None
    held = [f for f in foreign if int(f.get("bytes") or 0) > 0]
    if not held:
        return "valid while no other process holds memory on its GPUs (none did when it was measured)"
    return "valid while " + "; ".join(
        f"GPU {f['index']} carries at most {-(-int(f['bytes']) // (1 << 20))} MiB of other processes"
        + (f" ({', '.join(p['name'] + ' pid ' + str(p['pid']) for p in f.get('processes') or [])})"
           if f.get("processes") else "") for f in held)


def certified_metrics(trial: TrialRecord) -> dict[str, float | int | None]:
    m = trial.metrics
    return {k: m.get(k) for k in CERTIFIED_METRICS}


def headroom(trial: TrialRecord, scenario: Scenario) -> list[GpuHeadroom]:
    memory = trial.memory
    peaks = [int(b) for b in memory.get("peak_bytes") or []]
    totals_raw = memory.get("total_bytes")
    totals = [int(b) for b in totals_raw] if isinstance(totals_raw, list) else [int(totals_raw or 0)] * len(peaks)
    devices = list(memory.get("devices") or range(len(peaks)))
    threshold = threshold_of(scenario)
    out = []
    for index, peak, total in zip(devices, peaks, totals, strict=False):
        free = total - peak
        out.append(GpuHeadroom(int(index), round(peak / GIB, 3), round(total / GIB, 3), round(free / GIB, 3),
                               round(free / total * 100, 2) if total else 0.0,
                               round(threshold.limit_bytes(total) / GIB, 3)))
    return out


def threshold_text(scenario: Scenario) -> str:
    return memory_margin.describe(threshold_of(scenario))


def _length(settings: LengthSettings) -> str:
    if settings.kind == "fixed":
        return str(settings.value)
    if settings.kind == "uniform":
        return f"{settings.low}-{settings.high}"
    if settings.kind == "normal":
        return f"normal({settings.mean:g}, {settings.stddev:g})"
    return f"lognormal(median {settings.median:g}, sigma {settings.sigma:g})"


def workload_text(scenario: Scenario) -> str:
    w = scenario.workload
    r, a = w.requests, w.arrivals
    requests = (f"trace {r.path}" if r.kind == "trace" else
                f"{r.count} {r.api} requests, prompts {_length(r.prompt_tokens)} tokens, outputs "
                f"{_length(r.output_tokens)} tokens")
    if a.kind == "concurrency":
        arrivals = f"concurrency {a.concurrency}"
    elif a.kind == "poisson":
        arrivals = f"Poisson {a.rate:g} req/s"
    elif a.kind == "burst":
        arrivals = f"bursts of {a.burst_size} every {a.burst_interval_s:g} s"
    else:
        arrivals = "trace timestamps"
    return f"{requests}, {arrivals}"


def inventory_summary(inventory: list[str]) -> str:
    """`8× NVIDIA GeForce RTX 3090 (23.69 GiB)` rather than the same name eight times."""
    groups: list[tuple[str, int]] = []
    for name in inventory:
        if groups and groups[-1][0] == name:
            groups[-1] = (name, groups[-1][1] + 1)
        else:
            groups.append((name, 1))
    return ", ".join(f"{n}× {name}" for name, n in groups) or "none recorded"


def twin_note(study: StudyData) -> str | None:
    """The twin's finalists' error on this box (predicted when queued against measured), beside the
    simulator's accuracy against published runs: how far its ranking could be trusted here."""
    metric = study.scenario.objectives[0].metric
    errors = [abs(float(t.result["twin_predicted"]) / float(t.metrics[metric]) - 1) for t in study.trials
              if isinstance(t.result.get("twin_predicted"), int | float) and t.metrics.get(metric)]
    if not errors:
        return None
    p50 = statistics.median(errors)
    return (f"{len(errors)} finalist(s) of the calibrated twin guided the search; their {metric} was predicted "
            f"within {p50:.1%} (median, worst {max(errors):.1%}) of what this box measured; {SIM_ACCURACY.quote()}")


def simulator_note(study: StudyData, trial: TrialRecord) -> str | None:
    backend = backend_for(study.scenario)
    if not backend.simulated:
        return None
    if not backend.runs_process:
        return ("evaluated by the simulator's engine core in virtual time (no engine process ran, no GPU was "
                "used): the figures are a model of the GPUs above; check the real box with `autotuner verify` "
                f"before relying on them; {SIM_ACCURACY.quote()}")
    scale = float(trial.result.get("time_scale") or 1.0)
    return (f"measured against the simulated vLLM, which ran {scale:g}x faster than the simulated hardware; "
            "latencies and throughput are in simulated-hardware time: check the real box with "
            f"`autotuner verify` before relying on them; {SIM_ACCURACY.quote()}")


def _baseline(trial: TrialRecord | None) -> BaselineComparison | None:
    if trial is None:
        return None
    return BaselineComparison(trial.trial_number, trial.outcome, trial.reason, certified_metrics(trial),
                              trial.memory.get("peak_fraction"))


def baseline_line(baseline: BaselineComparison | None) -> str:
    """The baseline's own single run, when no comparison could be made: figures, never a percentage."""
    if baseline is None:
        return f"{BASELINE_LABEL}: not measured in this study"
    head = f"{BASELINE_LABEL}: trial {baseline.trial}, {baseline.outcome}"
    m = baseline.metrics
    if baseline.outcome != "ok" or m.get("output_tokens_per_s") is None:
        return head + (f" — {baseline.reason}" if baseline.reason else "")
    return (f"{head} — one run: output {rate(m.get('output_tokens_per_s'))}, TTFT p95 {seconds(m.get('ttft_p95_s'))}, "
            f"peak {percent(baseline.peak_fraction)}")

