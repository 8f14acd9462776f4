"""`autotuner report`: what the study found, for a person deciding whether to deploy it.

Writes `report.md` (with `pareto.png` and `memory.png` beside it) and `report.html` (one
self-contained page, the same PNGs embedded as base64). Everything is written into a staging
directory first and moved into place at the end, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import datetime as dt
import html
import sys
from pathlib import Path

from autotuner.analysis.candidates import Analysis, analyse, choose, verdict
from autotuner.analysis.compare import (
    Comparison,
    Difference,
    Verdict,
    headline,
    recommended,
    reference_label,
    show,
)
from autotuner.analysis.evidence import confirmations, last_soak, soaks
from autotuner.analysis.slo import scenario_slos
from autotuner.analysis.study_data import StudyData, load_study
from autotuner.analysis.wording import outcome_text, shorten, shown_counts
from autotuner.export.atomic import check_output_dir, staged_dir
from autotuner.export.certificate import (
    headroom,
    inventory_summary,
    simulator_note,
    threshold_text,
    workload_text,
)
from autotuner.export.document import Block, Document, Image, Section, Table, to_html, to_markdown
from autotuner.store.db import TrialRecord
from autotuner.units import change, flag_value, gib, percent, rate, seconds

POLICY = "knee"
# Recommended-against-reference rows: (label, metric, unit, digits).
COMPARED = (
    ("output throughput", "output_tokens_per_s", "tok/s", 1),
    ("total throughput", "total_tokens_per_s", "tok/s", 1),
    ("TTFT p50", "ttft_p50_s", "s", 3),
    ("TTFT p95", "ttft_p95_s", "s", 3),
    ("TPOT p50", "tpot_p50_s", "s", 4),
    ("e2e p95", "e2e_p95_s", "s", 2),
)


def run_report(storage: str, study: str | None, out_dir: Path) -> int:
    check_output_dir(out_dir)
    data = load_study(storage, study)
    if data.note:
        print(f"note: {data.note}", file=sys.stderr)
    analysis = analyse(data, scenario_slos(data.scenario.slos))
    single_shot = choose(POLICY, analysis)
    winner, compared = recommended(analysis, POLICY)
    # Imported here: matplotlib takes a second to load and only the report needs it.
    from autotuner.export.plots import memory_png, pareto_png

    pareto = Image("pareto.png", "Pareto front: output tokens/s against TTFT p95", pareto_png(analysis, winner))
    shown = winner or data.baseline
    memory = None
    if shown is not None and shown.timeline:
        memory = Image("memory.png", f"GPU memory of trial {shown.trial_number}", memory_png(analysis, shown))
    doc = build_document(analysis, winner, pareto, memory, compared)
    soak = last_soak(soaks(data.trials), winner.trial_number) if winner is not None else None
    soak_trial = next((t for t in data.trials if soak is not None and t.trial_number == soak.trial), None)
    soak_memory: Image | str | None = None
    if soak_trial is not None and soak_trial.timeline:
        soak_memory = Image("soak-memory.png", f"GPU memory during the soak (trial {soak_trial.trial_number})",
                            memory_png(analysis, soak_trial))
    elif soak_trial is not None:
        soak_memory = (f"No memory timeline of the soak (trial {soak_trial.trial_number}) to draw: none was "
                       "recorded (a run in virtual time keeps only its peak, in the soak table above).")
    section = verification_section(analysis, soak_memory)
    if winner is not None and single_shot is not None and winner.trial_number != single_shot.trial_number:
        section.blocks.insert(0, f"The single-shot best, trial {single_shot.trial_number}, was not the confirmed "
                              f"best: trial {winner.trial_number} is recommended on its re-measured bounds.")
    doc.sections.insert(3, section)
    with staged_dir(out_dir) as stage:
        (stage / "report.md").write_text(to_markdown(markdown_safe(doc)))
        (stage / "report.html").write_text(to_html(doc))
        for image in doc.images():
            (stage / image.filename).write_bytes(image.png)
    print(doc.lead, file=sys.stderr)
    print(f"wrote {out_dir / 'report.md'}, {out_dir / 'report.html'} ({len(doc.images())} plots) for study "
          f"{data.name}", file=sys.stderr)
    return 0


def markdown_safe(doc: Document) -> Document:
    """`doc` with its text HTML-escaped for report.md: Markdown renderers pass raw HTML through, and an
    engine's reason is the engine's text (a `<script>` or `<img onerror=…>` in a log line). report.html
    escapes the same text itself."""
    def e(text: str) -> str:
        return html.escape(text, quote=False)

    def block(b: Block) -> Block:
        if isinstance(b, Table):
            return Table([e(h) for h in b.header], [[e(c) for c in row] for row in b.rows])
        if isinstance(b, Image):
            return Image(b.filename, e(b.alt), b.png)
        return e(b)

    return Document(e(doc.title), [Section(e(s.title), [block(b) for b in s.blocks]) for s in doc.sections],
                    e(doc.lead))


def measured(trial: TrialRecord) -> dict[str, object]:
    """Figures worth showing: a trial stopped at the OOM threshold or crashed keeps the partial figures
    of its last seconds, which would read as a (terrible) result."""
    return trial.metrics if trial.outcome == "ok" else {}


def searched_flags(trial: TrialRecord, fixed: dict[str, object]) -> str:
    return " ".join(f"{k}={flag_value(v)}" for k, v in trial.flags.items() if k not in fixed or fixed[k] != v)


def build_document(analysis: Analysis, winner: TrialRecord | None, pareto: Image, memory: Image | None,
                   compared: list[Comparison]) -> Document:
    study = analysis.study
    sc = study.scenario
    key = study.record.key
    created = dt.datetime.fromtimestamp(study.record.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc = Document(f"Tuning report: {study.name}", lead=headline(winner, compared))

    summary = Section("Summary", [
        f"Scenario {study.record.scenario_name}, storage {study.storage}, created {created}. "
        f"{len(study.trials)} trials ({shown_counts(study.trials)}); {len(analysis.feasible)} feasible, "
        f"{len(analysis.candidates)} also meet the scenario's SLOs; the Pareto front holds "
        f"{len(analysis.front)}.",
        (f"{'Best found' if compared and compared[0].keep_reference else 'Recommended'} ({POLICY}): trial "
         f"{winner.trial_number}, {searched_flags(winner, sc.engine.flags)}."
         if winner is not None else
         "No trial is feasible under the scenario's SLOs: nothing to recommend. Tune longer or widen the "
         "search space toward less memory."),
    ])
    note = simulator_note(study, winner or study.trials[0])
    if note:
        summary.blocks.append(f"Simulator: {note}.")
    doc.sections.append(summary)

    doc.sections.append(Section("Study key", [Table(["what", "value"], [
        ["model", f"{sc.engine.model} (fingerprint {key.model_fingerprint})"],
        ["GPUs", inventory_summary(key.gpu_inventory)],
        ["engine", f"vLLM {key.engine_version}"],
        ["workload", f"{workload_text(sc)} (fingerprint {key.workload_fingerprint})"],
        ["key digest", key.digest()],
        ["objectives", ", ".join(f"{o.direction} {o.metric}" for o in sc.objectives)],
        ["SLOs", "; ".join(s.describe() for s in analysis.slos) or "none"],
        ["OOM threshold", threshold_text(sc)],
        ["fixed flags", " ".join(f"{k}={flag_value(v)}" for k, v in sc.engine.flags.items()) or "none"],
    ])]))

    front_rows = [[str(t.trial_number), searched_flags(t, sc.engine.flags), rate(t.metrics.get("output_tokens_per_s")),
                   seconds(t.metrics.get("ttft_p95_s")), percent(t.memory.get("peak_fraction"))]
                  for t in sorted(analysis.front, key=lambda t: t.trial_number)]
    doc.sections.append(Section("Pareto front", [
        pareto,
        "Coloured: feasible trials meeting the SLOs; circled red: the Pareto front; star: the recommended "
        "knee. Hollow grey: measured but infeasible (missed an SLO, lost requests, or peaked above the OOM "
        "threshold). The band below lists trials "
        "that produced no measurement (OOM, failed start), by outcome; their reasons are in the trials table.",
        Table(["trial", "searched flags", "output tok/s (one run)", "TTFT p95 (one run)", "memory peak"], front_rows)
        if front_rows else "The front is empty.",
    ]))

    doc.sections.append(Section("Recommended against the configs it would replace",
                                [_comparison(c, study, winner) for c in compared] or
                                ["No recommendation, or no reference config measured: nothing to compare."]))

    memory_blocks: list[str | Table | Image] = []
    shown = winner or study.baseline
    if shown is not None and shown.memory.get("peak_bytes"):
        # The peaks per GPU always (they were measured); the plot only from a timeline that was recorded.
        memory_blocks.append(memory if memory is not None else
                             "No memory timeline to draw: none was recorded (a run in virtual time keeps only its "
                             "peak per GPU, below).")
        engine, foreign = _split_peak(shown)
        memory_blocks.append(Table(
            ["GPU", "peak", "our engine", "other processes", "total", "headroom", "headroom %", "OOM threshold"], [
                [str(g.index), f"{g.peak_gib:.2f} GiB", engine.get(g.index, "-"), foreign.get(g.index, "-"),
                 f"{g.total_gib:.2f} GiB", f"{g.headroom_gib:.2f} GiB", f"{g.headroom_pct:.1f} %",
                 f"{g.threshold_gib:.2f} GiB"] for g in headroom(shown, sc)]))
        if winner is None:
            memory_blocks.insert(0, f"No recommendation: this is the baseline, trial {shown.trial_number}.")
    else:
        memory_blocks.append("No memory measurement to show.")
    doc.sections.append(Section("Memory", memory_blocks))

    rows = []
    for t in study.trials:
        reason = verdict(t, analysis)
        m = measured(t)
        rows.append([str(t.trial_number), t.kind, outcome_text(t), searched_flags(t, sc.engine.flags),
                     rate(m.get("output_tokens_per_s")), seconds(m.get("ttft_p95_s")),
                     percent(t.memory.get("peak_fraction")), reason])
    doc.sections.append(Section("Trials", [Table(
        ["trial", "kind", "outcome", "searched flags", "output tok/s (one run)", "TTFT p95 (one run)", "memory peak",
         "reason"], rows)]))
    return doc


def _comparison(c: Comparison, study: StudyData, winner: TrialRecord | None) -> Table | str:
    """One reference against the recommendation: re-measured means with their 95 % intervals and the
    difference only where it is beyond the noise; single runs are shown as such and never compared."""
    if c.verdict == Verdict.SAME or winner is None:
        text = c.sentence()
        return text[0].upper() + text[1:] + "."
    ref = next(t for t in study.trials if t.trial_number == c.reference)
    confirmed = confirmations(study.trials)
    mine, theirs = confirmed.get(winner.trial_number), confirmed.get(ref.trial_number)
    header = ["", f"{c.label}, trial {ref.trial_number}", f"recommended, trial {winner.trial_number}",
              "difference (beyond the noise at 95 %)"]
    rows = [["outcome", outcome_text(ref), outcome_text(winner), ""],
            ["flags", searched_flags(ref, study.scenario.engine.flags),
             searched_flags(winner, study.scenario.engine.flags), ""]]
    for label, metric, unit, digits in COMPARED:
        a = mine.intervals.get(metric) if mine is not None else None
        b = theirs.intervals.get(metric) if theirs is not None else None
        if a is not None and b is not None:
            d = Difference(metric, label, unit, digits, a, b)
            rows.append([label + " (mean)", show(b, unit, digits), show(a, unit, digits), d.delta()])
        else:
            old, new = measured(ref).get(metric), measured(winner).get(metric)
            fmt = rate if unit == "tok/s" else seconds
            rows.append([label + " (one run)", fmt(old), fmt(new), "not compared: one run"])
    old_peak = theirs.worst_peak_fraction if theirs is not None else ref.memory.get("peak_fraction")
    new_peak = mine.worst_peak_fraction if mine is not None else winner.memory.get("peak_fraction")
    rows.append(["memory peak (fullest GPU, worst run)", percent(old_peak), percent(new_peak), ""])
    kv_old, kv_new = ref.engine.get("kv_cache_tokens"), winner.engine.get("kv_cache_tokens")
    rows.append(["KV cache tokens", str(kv_old or "-"), str(kv_new or "-"), change(kv_new, kv_old)])
    if ref.outcome != "ok":
        rows.append([f"{c.label}: failure", ref.reason or ref.outcome, "", ""])
    return Table(header, rows)


def verification_section(analysis: Analysis, soak_memory: Image | str | None) -> Section:
    """Confirmation intervals per re-measured trial, the soaks, and the winner's soak memory."""
    trials = analysis.study.trials
    confirmed = confirmations(trials)
    soaked = soaks(trials)
    blocks: list[str | Table | Image] = []
    if not confirmed:
        blocks.append("Nothing was re-measured: run `autotuner confirm` (export refuses an unconfirmed winner).")
    else:
        rows = []
        for number, c in sorted(confirmed.items()):
            thr, ttft = c.intervals.get("output_tokens_per_s"), c.intervals.get("ttft_p95_s")
            last = last_soak(soaked, number)
            soak_text = "-" if last is None else ("passed" if last.passed else f"failed: {shorten(last.reason or '')}")
            rows.append([_trial_label(number, analysis.study), f"{len(c.runs)} on {c.lifetimes} starts"
                         + (" + its search run" if c.search_run else ""),
                         f"{thr.mean:.1f} ± {thr.half_width:.1f}" if thr else "-",
                         f"{ttft.mean:.3f} ± {ttft.half_width:.3f} s" if ttft else "-",
                         percent(c.worst_peak_fraction), shorten("; ".join(c.bad_runs)) or "-",
                         "-" if c.offload is None else str(c.offload.get("verified")),
                         soak_text])
        blocks.append(Table(["trial", "runs (engine starts)", "output tok/s (mean ± 95 % CI over starts)",
                             "TTFT p95 (mean ± 95 % CI)",
                             "worst peak", "failed runs", "offload verified", "soak"], rows))
    soak_rows = [[str(v.trial), str(v.original), "passed" if v.passed else "FAILED", seconds(v.duration_s),
                  v.workload, percent(v.peak_fraction), seconds(v.ttft_p99_s), seconds(v.itl_p99_s),
                  f"{min(v.headroom_gib or [0]):.2f} GiB"]
                 for vs in soaked.values() for v in vs]
    if soak_rows:
        blocks.append(Table(["soak trial", "of trial", "result", "duration", "workload", "peak", "TTFT p99",
                             "ITL p99", "least headroom"], sorted(soak_rows, key=lambda r: int(r[0]))))
    else:
        blocks.append("No soak ran: run `autotuner soak`.")
    if soak_memory is not None:
        blocks.append(soak_memory)
    return Section("Verification", blocks)



def _trial_label(number: int, study: StudyData) -> str:
    """`0 (vLLM's defaults)` for a reference re-measured beside the candidates."""
    trial = next((t for t in study.trials if t.trial_number == number), None)
    return f"{number} ({reference_label(trial)})" if trial is not None and trial.kind in ("baseline", "current") \
        else str(number)


def _split_peak(trial: TrialRecord) -> tuple[dict[int, str], dict[int, str]]:
    """Per GPU: our engine's peak and the memory other processes held beside it (the device-level peak
    above is what the OOM threshold watched)."""
    devices = trial.memory.get("devices") or []
    ours = trial.memory.get("engine_peak_bytes") or []
    engine = {int(i): gib(b) for i, b in zip(devices, ours, strict=False)}
    foreign: dict[int, str] = {}
    for f in trial.memory.get("foreign") or []:
        names = ", ".join(f"{p.get('name')} pid {p.get('pid')}" for p in f.get("processes") or [])
        foreign[int(f.get("index", -1))] = gib(int(f.get("bytes") or 0)) + (f" ({names})" if names else "")
    return engine, foreign
