"""The report's two pictures, as PNG bytes: the Pareto front and the winner's memory over time.

Only measured values are drawn: the placeholder objective values the tuner told Optuna for infeasible
trials are never read, so they cannot stretch the axes. Infeasible trials get their own band under the
plot, by trial number and outcome.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display, no GUI toolkit: files only

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from autotuner.analysis.candidates import THROUGHPUT, TTFT, Analysis
from autotuner.analysis.evidence import confirmations
from autotuner.analysis.wording import outcome_text
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import TRUST_KINDS
from autotuner.trials.scoring import threshold_of
from autotuner.units import GIB

DPI = 110


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _measured(trial: TrialRecord, metric: str) -> float | None:
    value = trial.metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def pareto_png(analysis: Analysis, chosen: TrialRecord | None) -> bytes:
    return _png(pareto_figure(analysis, chosen))


def pareto_figure(analysis: Analysis, chosen: TrialRecord | None) -> Figure:
    """Main axes: measured trials; lower band: trials without a measurement, by outcome."""
    study = analysis.study
    scenario = study.scenario
    candidates = {t.trial_number for t in analysis.candidates}
    front = sorted(analysis.front, key=lambda t: _measured(t, TTFT) or 0.0)
    fig, (ax, band) = plt.subplots(2, 1, figsize=(8, 6.2), gridspec_kw={"height_ratios": [5, 1.3]})
    ax.set_label("measured")
    band.set_label("infeasible")

    # Trials that ran and were measured: feasible ones coloured by trial number, the rest hollow grey.
    # Confirmation and soak runs are evidence about a searched trial, drawn as its error bars.
    searched = [t for t in study.trials if t.kind not in TRUST_KINDS]
    points = [(t, _measured(t, TTFT), _measured(t, THROUGHPUT)) for t in searched
              if t.outcome == "ok" and t.state == "COMPLETE"]
    points = [(t, x, y) for t, x, y in points if x is not None and y is not None]
    good = [(t, x, y) for t, x, y in points if t.trial_number in candidates]
    weak = [(t, x, y) for t, x, y in points if t.trial_number not in candidates]
    if weak:
        ax.scatter([x for _, x, _ in weak], [y for _, _, y in weak], facecolors="none", edgecolors="0.55",
                   s=36, label="measured, infeasible (SLO, lost requests, memory)")
    if good:
        sc = ax.scatter([x for _, x, _ in good], [y for _, _, y in good], c=[t.trial_number for t, _, _ in good],
                        cmap="viridis", s=40, zorder=3, label="feasible")
        bar = fig.colorbar(sc, ax=ax, label="trial number", pad=0.01)
        bar.locator = MaxNLocator(integer=True)  # trial numbers: no 0.25, 1.25, …
        bar.update_ticks()
    if front:
        ax.plot([_measured(t, TTFT) for t in front], [_measured(t, THROUGHPUT) for t in front], color="crimson",
                lw=1.2, zorder=2, drawstyle="steps-post")
        ax.scatter([_measured(t, TTFT) for t in front], [_measured(t, THROUGHPUT) for t in front], s=110,
                   facecolors="none", edgecolors="crimson", linewidths=1.8, zorder=4, label="Pareto front")
    if chosen is not None and _measured(chosen, TTFT) is not None:
        ax.scatter([_measured(chosen, TTFT)], [_measured(chosen, THROUGHPUT)], marker="*", s=260, color="gold",
                   edgecolors="black", zorder=5, label=f"knee: trial {chosen.trial_number}")
    labelled = False
    for number, c in sorted(confirmations(study.trials).items()):
        thr, ttft = c.intervals.get(THROUGHPUT), c.intervals.get(TTFT)
        if thr is None or ttft is None:
            continue
        ax.errorbar([ttft.mean], [thr.mean], xerr=[[ttft.mean - ttft.low], [ttft.high - ttft.mean]],
                    yerr=[[thr.mean - thr.low], [thr.high - thr.mean]], fmt="D", color="black", ms=4, capsize=3,
                    lw=1, zorder=6, label=None if labelled else "re-measured: mean, 95 % CI (#trial)")
        _label(ax, f"#{number}", ttft.mean, thr.mean, (5, 3), "left", "bottom")
        labelled = True
    baseline = study.baseline
    if baseline is not None and _measured(baseline, TTFT) is not None and _measured(baseline, THROUGHPUT):
        _label(ax, f"baseline #{baseline.trial_number}", _measured(baseline, TTFT) or 0.0,
               _measured(baseline, THROUGHPUT) or 0.0, (0, -10), "center", "top")
    if TTFT in scenario.slos:
        ax.axvline(scenario.slos[TTFT], color="0.3", ls="--", lw=1, label=f"SLO TTFT p95 ≤ {scenario.slos[TTFT]:g} s")
    ax.set_xlabel("TTFT p95 (s)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{study.name}: throughput against time to first token")
    ax.grid(alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, "no trial produced measurements", ha="center", va="center", transform=ax.transAxes)
    ax.legend(fontsize=8, loc="best")
    ax.margins(x=0.12, y=0.12)  # room for the labels at the edges: nothing clipped

    # The band: trials that did not run to a measurement, by outcome.
    failed = [t for t in searched if t.outcome != "ok"]
    outcomes = sorted({outcome_text(t) for t in failed})
    numbers = [t.trial_number for t in searched] or [0]
    for row, outcome in enumerate(outcomes):
        xs = [t.trial_number for t in failed if outcome_text(t) == outcome]
        band.scatter(xs, [row] * len(xs), marker="x", color="crimson" if "oom" in outcome.lower() else "0.35", s=36)
    band.xaxis.set_major_locator(MaxNLocator(integer=True))
    band.set_yticks(range(len(outcomes)), outcomes, fontsize=8)
    band.set_ylim(-0.7, max(len(outcomes), 1) - 0.3)
    band.set_xlim(min(numbers) - 0.5, max(numbers) + 0.5)
    band.set_xlabel("trial number (infeasible: no throughput or latency to plot)")
    band.grid(alpha=0.3, axis="x")
    if not outcomes:
        band.text(0.5, 0.5, "no infeasible trial", ha="center", va="center", transform=band.transAxes, fontsize=9)
        band.set_yticks([])
    fig.tight_layout()
    return fig


def _label(ax: Axes, text: str, x: float, y: float, offset: tuple[int, int], ha: str, va: str) -> None:
    """A small label beside a point, on a white ground so that lines do not cross it, never clipped."""
    ax.annotate(text, (x, y), textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=7,
                annotation_clip=False, zorder=7, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                                       "alpha": 0.8})


def memory_png(analysis: Analysis, trial: TrialRecord) -> bytes:
    """Per-GPU used memory over the trial, with each GPU's total and the OOM threshold. Callers draw it
    only for a trial with a timeline: one evaluated in virtual time has its per-GPU peaks only, which a
    sentence says better than a row of identical bars."""
    scenario = analysis.study.scenario
    memory = trial.memory
    totals_raw = memory.get("total_bytes")
    peaks = [int(b) for b in memory.get("peak_bytes") or []]
    totals = [int(b) for b in totals_raw] if isinstance(totals_raw, list) else [int(totals_raw or 0)] * len(peaks)
    devices = list(memory.get("devices") or range(len(peaks)))
    threshold = threshold_of(scenario)
    total = max(totals) if totals else 0
    limit = threshold.limit_bytes(min(totals)) if totals else 0
    fig, ax = plt.subplots(figsize=(8, 4.2))
    timeline = trial.timeline
    scale = float(trial.result.get("time_scale") or 1.0)
    ts = [float(point[0]) * scale for point in timeline]
    width = len(timeline[0][1]) if timeline else 0
    for i in range(width):
        label = f"GPU {devices[i]}" if i < len(devices) else f"device {i}"
        ax.plot(ts, [point[1][i] / GIB for point in timeline], lw=1.1, label=label)
    ax.set_xlabel("time since launch (s, " + ("simulated-hardware time)" if scale != 1 else "wall-clock)"))
    title = f"trial {trial.trial_number}: GPU memory in use"
    if not timeline:
        ax.text(0.5, 0.5, f"no memory timeline recorded (peak {max(peaks or [0]) / GIB:.2f} GiB)", ha="center",
                va="center", transform=ax.transAxes)
    if total:
        ax.axhline(total / GIB, color="black", lw=1.2, label=f"total {total / GIB:.2f} GiB")
        ax.axhline(limit / GIB, color="crimson", ls="--", lw=1.2, label=f"OOM threshold {limit / GIB:.2f} GiB")
        ax.set_ylim(0, total / GIB * 1.08)
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) > 12:  # many GPUs: the lines speak for themselves, keep the reference lines named
        keep = [i for i, label in enumerate(labels) if not label.startswith("GPU ")]
        handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    ax.legend(handles, labels, fontsize=8, loc="lower right", ncol=2)
    fig.tight_layout()
    return _png(fig)
