"""`autotuner status`: the studies in a storage at a glance, the trials of one study, and `--watch`,
which follows a running study from the database with the live view of `tune`. The numbers come from
the analysis of a stored study; this module only lays them out."""

from __future__ import annotations

import time
from contextlib import nullcontext

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotuner.analysis.candidates import analyse, verdict
from autotuner.analysis.compare import recommended, show
from autotuner.analysis.evidence import Confirmation, confirmations
from autotuner.analysis.slo import scenario_slos
from autotuner.analysis.study_data import load_study, open_store, read_study
from autotuner.analysis.wording import outcome_text, shorten
from autotuner.errors import UserInputError
from autotuner.export.certificate import time_basis
from autotuner.secrets import display_url
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import AFTER_SEARCH, OOM_OUTCOMES, TRUST_KINDS
from autotuner.units import flag_value, percent, seconds
from autotuner.view.live import LiveView

# Reasons in the trials table are cut at a word boundary near this length; `--trial N` shows them whole.
REASON_LIMIT = 120


def run_status(storage: str, study: str | None = None, console: Console | None = None,
               trial: int | None = None) -> int:
    console = console or Console()
    if trial is not None:
        if study is None:
            raise UserInputError("status --trial needs a study: autotuner status STUDY --trial N")
        _one_trial(storage, study, trial, console)
        return 0
    if study is not None:
        _trials(storage, study, console)
        return 0
    store = open_store(storage)
    records = store.studies()
    if not records:
        shown = display_url(storage)
        console.print(f"no study in {shown} yet: run `autotuner tune SCENARIO --storage {shown}`")
        return 0
    table = Table(title=f"studies in {display_url(storage)}", title_justify="left")
    # "searched" counts the search's trials (what `tune`'s N/M counts, plus the ones the memory model
    # skipped), "re-runs" the trust phase's runs after it (confirmation, soak, a backed-off candidate).
    counts = ("searched", "re-runs", "feasible", "OOM")
    for column in ("study", "scenario", *counts, "recommended", "compared with"):
        table.add_column(column, overflow="fold", justify="right" if column in counts else "left")
    for record in records:
        data = read_study(store, record, display_url(storage))
        analysis = analyse(data, scenario_slos(data.scenario.slos))
        trials = data.trials
        winner, compared = recommended(analysis)
        reruns = sum(t.kind in AFTER_SEARCH for t in trials)
        table.add_row(
            record.study_name, record.scenario_name, str(len(trials) - reruns), str(reruns),
            str(len(analysis.candidates)), str(sum(t.outcome in OOM_OUTCOMES for t in trials)),
            _recommended(winner, confirmations(trials)),
            "; ".join(c.brief() for c in compared) or ("baseline not measured yet" if data.baseline is None else "-"),
        )
    console.print(table)
    return 0


def _recommended(winner: TrialRecord | None, confirmed: dict[int, Confirmation]) -> str:
    """`trial 1: 113.9 ± 8.2 tok/s (mean)` when re-measured, else the one run it was."""
    if winner is None:
        return "none yet"
    c = confirmed.get(winner.trial_number)
    iv = c.intervals.get("output_tokens_per_s") if c is not None else None
    if iv is not None:
        return f"trial {winner.trial_number}: {show(iv, 'tok/s', 1)} (mean, n={iv.n})"
    return f"trial {winner.trial_number}: {_number(winner.metrics.get('output_tokens_per_s'))} tok/s (one run)"


def _trials(storage: str, name: str, console: Console) -> None:
    data = load_study(storage, name)
    analysis = analyse(data, scenario_slos(data.scenario.slos))
    feasible = {t.trial_number for t in analysis.candidates}
    front = {t.trial_number for t in analysis.front}
    fixed = data.scenario.engine.flags
    table = Table(title=f"study {data.name} ({data.record.scenario_name}) in {data.storage}", title_justify="left")
    for column in ("#", "kind", "outcome", "feasible", "searched flags", "output tok/s", "TTFT p95", "mem peak",
                   "reason"):
        table.add_column(column, overflow="fold")
    for t in data.trials:
        ok = t.outcome == "ok"
        # A confirmation or soak run re-measures a candidate: evidence about it, never a candidate itself.
        mark = "front" if t.trial_number in front else ("yes" if t.trial_number in feasible else "no")
        if t.kind in TRUST_KINDS:
            mark = "re-run"
        flags = " ".join(f"{k}={flag_value(v)}" for k, v in t.flags.items() if k not in fixed)
        table.add_row(str(t.trial_number), t.kind, outcome_text(t), mark, flags,
                      _number(t.metrics.get("output_tokens_per_s")) if ok else "-",
                      seconds(t.metrics.get("ttft_p95_s")) if ok else "-", percent(t.memory.get("peak_fraction")),
                      shorten(verdict(t, analysis), REASON_LIMIT, f"--trial {t.trial_number}"))
    console.print(table)
    console.print(f"output tok/s and TTFT p95: one run each, in {time_basis(data)}; their re-measured means "
                  "are in `autotuner report`. A reason cut short (…) is whole in "
                  f"`autotuner status {data.name} --trial N`.", highlight=False)


def _one_trial(storage: str, name: str, number: int, console: Console) -> None:
    """Everything stored about one trial, the reason in full."""
    data = load_study(storage, name)
    trial = next((t for t in data.trials if t.trial_number == number), None)
    if trial is None:
        raise UserInputError(f"--trial {number}: study {data.name} has trials 0-{len(data.trials) - 1}")
    analysis = analyse(data, scenario_slos(data.scenario.slos))
    console.print(f"trial {number} of study {data.name}: {trial.kind}, {outcome_text(trial)}"
                  + (f" (stored as {trial.outcome})" if outcome_text(trial) != trial.outcome else ""), highlight=False)
    console.print("flags: " + " ".join(f"{k}={flag_value(v)}" for k, v in trial.flags.items()), highlight=False)
    console.print(f"reason: {verdict(trial, analysis) or '-'}", highlight=False, soft_wrap=True)
    for key in ("output_tokens_per_s", "ttft_p95_s", "tpot_p50_s", "completed", "failed"):
        if key in trial.metrics and trial.outcome == "ok":
            console.print(f"{key}: {trial.metrics[key]}", highlight=False)
    console.print(f"memory peak: {percent(trial.memory.get('peak_fraction'))}", highlight=False)


def _number(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def watch_view(storage: str, name: str, console: Console) -> LiveView | None:
    """The live view of `tune`, rebuilt from the database: what another terminal (or another box on
    PostgreSQL) sees of a running study. None while the study does not exist yet."""
    try:
        data = load_study(storage, name)
    except UserInputError:
        return None
    sc = data.scenario
    analysis = analyse(data, scenario_slos(sc.slos))
    candidates = {t.trial_number for t in analysis.candidates}
    objectives = [o.metric for o in sc.objectives]
    trials = sorted(data.trials, key=lambda t: t.started_at)
    now = [trials[0].started_at if trials else time.time()]  # the view's clock: replayed, then the present
    view = LiveView(objectives, [o.direction for o in sc.objectives], None, console=console,
                    clock=lambda: now[0], live=False)
    budget = max(sc.budget.trials, len(trials))
    view("started", {"study": data.name, "sampler": "from the database", "budget": budget})
    fixed = sc.engine.flags
    for index, t in enumerate(trials, start=1):
        now[0] = t.started_at
        view("trial", {"number": t.trial_number, "index": index, "budget": budget, "kind": t.kind,
                       "flags": {k: v for k, v in t.flags.items() if k not in fixed}})
        view("phase", {"phase": "workload"})  # an engine ran: its duration counts for the ETA
        values = [t.metrics.get(o) for o in objectives]
        ok = t.trial_number in candidates and None not in values
        now[0] = t.finished_at
        view("finished", {"number": t.trial_number, "outcome": t.outcome, "feasible": ok, "values": values,
                          "metrics": t.metrics, "peak_fraction": t.memory.get("peak_fraction"),
                          "reason": t.reason or (None if ok else verdict(t, analysis)), "kind": t.kind})
    now[0] = time.time()
    return view


def watch(storage: str, name: str, console: Console | None = None, interval_s: float = 2.0,
          rounds: int | None = None) -> int:
    """`status STUDY --watch`: the trial table, refreshed from the database until interrupted. On a
    terminal it redraws in place; piped, it prints the table again each time a trial is added."""
    console = console or Console()
    shown = -1
    with Live(console=console, auto_refresh=False, transient=False) if console.is_terminal else nullcontext() as live:
        n = 0
        while rounds is None or n < rounds:
            n += 1
            view = watch_view(storage, name, console)
            renderable = view.render() if view is not None else Text(
                f"waiting for study {name} in {display_url(storage)} …")
            count = len(view.rows) if view is not None else 0
            if live is not None:
                live.update(renderable, refresh=True)
            elif count != shown:
                console.print(renderable)
                console.file.flush()
            shown = count
            time.sleep(interval_s)
    return 0
