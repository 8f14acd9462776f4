"""Choosing the configuration to deploy: load a study, keep the candidates, prefer a confirmed trial that
stands, and say what verification the chosen one still lacks (each with the command that adds it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotuner.analysis.candidates import Analysis, analyse, check_policy, choose
from autotuner.analysis.compare import Comparison, comparisons
from autotuner.analysis.confirmed import confirmation_problem, confirmed_ranking
from autotuner.analysis.evidence import Confirmation, SoakVerdict, confirmations, last_soak, soaks
from autotuner.analysis.pareto import number
from autotuner.analysis.slo import combine
from autotuner.analysis.study_data import StudyData, load_study
from autotuner.errors import UserInputError
from autotuner.store.db import TrialRecord
from autotuner.trials.offload_axis import from_flags


@dataclass
class Selection:
    analysis: Analysis
    policy: str
    chosen: TrialRecord  # with confirmed bounds in place of its single-shot metrics when confirmed
    baseline: TrialRecord | None
    confirmation: Confirmation | None = None
    soak: SoakVerdict | None = None
    single_shot: TrialRecord | None = None  # the single-shot choice, when confirmation chose another
    missing: list[str] = field(default_factory=list)  # verification the chosen trial lacks
    # Against the user's current config, then vLLM's defaults: from re-measured intervals only.
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def study(self) -> StudyData:
        return self.analysis.study


def select(storage: str, study: str | None, slo: list[str], policy: str) -> Selection:
    """The trial to deploy and the baseline to compare it with; UserInputError when there is none."""
    check_policy(policy)
    data = load_study(storage, study)
    slos = combine(data.scenario.slos, slo)
    analysis = analyse(data, slos)
    if not analysis.feasible:
        raise UserInputError(_no_feasible(data))
    naive = choose(policy, analysis)
    confirmed = confirmations(data.trials)
    soaked = soaks(data.trials)
    ranked = confirmed_ranking(policy, analysis, confirmed, soaked)
    chosen = ranked[0] if ranked else naive
    if chosen is None:
        raise UserInputError(_no_slo(analysis))
    selection = Selection(analysis, policy, chosen, data.baseline, confirmed.get(chosen.trial_number),
                          last_soak(soaked, chosen.trial_number))
    if naive is not None and naive.trial_number != chosen.trial_number:
        selection.single_shot = naive
    selection.missing = missing_verification(selection)
    selection.comparisons = comparisons(chosen, data.trials, confirmed)
    return selection


def missing_verification(selection: Selection) -> list[str]:
    """What the chosen trial lacks before it can be called safe, each with the command that adds it."""
    name = selection.study.name
    chosen = selection.chosen
    out = []
    c = selection.confirmation
    if c is None:
        out.append(f"confirmation (re-measured runs): run `autotuner confirm --study {name}`")
    else:
        problem = confirmation_problem(chosen, c, selection.study.scenario, selection.analysis.slos)
        if problem:
            out.append(f"a confirmation that holds ({problem}): tune further or run "
                       f"`autotuner confirm --study {name}`")
    if selection.soak is None:
        out.append(f"a soak under the worst workload: run `autotuner soak --study {name}`")
    elif not selection.soak.passed:
        out.append(f"a passed soak (trial {selection.soak.trial}: {selection.soak.reason}): "
                   f"run `autotuner soak --study {name}` for the next candidate")
    mode, offload = from_flags(chosen.flags, None)
    if mode != "none" and (c is None or c.offload is None or c.offload.get("verified") is not True):
        asked = f"--cpu-offload-gb {offload:g}" if mode == "uva" else "the prefetch offload"
        out.append(f"evidence that {asked} really offloaded: run `autotuner confirm --study {name}`")
    return out


# --- messages ----------------------------------------------------------------------------------------

def outcome_counts(trials: list[TrialRecord]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _no_feasible(study: StudyData) -> str:
    return (f"study {study.name} has no feasible trial ({len(study.trials)} trials: {outcome_counts(study.trials)}); "
            "nothing is safe to export. Tune longer (--trials), widen the search space toward less memory "
            "(lower max-num-batched-tokens or gpu-memory-utilization, some cpu-offload-gb), or see "
            f"`autotuner report --study {study.name}`")


def _no_slo(analysis: Analysis) -> str:
    feasible = analysis.feasible
    parts = []
    for slo in analysis.slos:
        values = [(t.metrics.get(slo.metric), t.trial_number) for t in feasible]
        measured = [(float(v), n) for v, n in values if number(v) is not None]
        meeting = sum(1 for v, _ in measured if slo.passes(v))
        origin = " (scenario slos)" if slo.source == "scenario" else ""
        text = f"{slo.describe()}{origin}: {meeting} of {len(feasible)} feasible trials meet it"
        if measured:
            pick = max if slo.higher_is_better else min
            best, best_trial = pick(measured)
            text += f", best seen {slo.show_value(best)} (trial {best_trial}); e.g. --slo '{slo.suggest(best)}'"
        parts.append(text)
    return (f"no feasible trial of study {analysis.study.name} meets every SLO — " + "; ".join(parts)
            + ". Relax the SLO (a --slo can only tighten the scenario's slos) or tune longer.")
