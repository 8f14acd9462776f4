"""`autotuner confirm`, `autotuner soak` and the trust phase at the end of `autotuner tune`: wiring and
what is printed. Bad input raises UserInputError (the CLI prints it, exit code 2)."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import typer

from autotuner.analysis.evidence import SoakVerdict
from autotuner.analysis.study_data import load_study, open_store
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trust.confirm import DEFAULT_REPEATS, DEFAULT_REPLAYS, DEFAULT_TOP, ConfirmReport, confirm, next_to_soak
from autotuner.trust.context import TrustContext
from autotuner.trust.soak import SoakReport, soak
from autotuner.tuner.runners import TrialRunner, runner_for
from autotuner.vllm import FlagValue

T = TypeVar("T")
# Virtual-time runs of a later command start on fresh noise draws, past any the search used.
FRESH_RUNS = 100_000


class ConfirmPlan(NamedTuple):
    top: int  # K candidates
    repeats: int  # R engine lifetimes each
    replays: int  # up to W replays of the workload per lifetime (while the spread lives there)


def parse_confirm(text: str) -> ConfirmPlan:
    """`3x3` / `3×3` (top K × repeats R), `3x3x2` (× replays W per lifetime, default 2); `0` skips
    confirmation (and so the soak)."""
    if text.strip() == "0":
        return ConfirmPlan(0, 0, 0)
    m = re.fullmatch(r"\s*(\d+)\s*[x×*]\s*(\d+)\s*(?:[x×*]\s*(\d+)\s*)?", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 2 or (m.group(3) is not None and int(m.group(3)) < 1):
        raise UserInputError(f"--confirm {text!r}: expected K×R such as 3x3 (K ≥ 1 candidates, R ≥ 2 repeats, each "
                             "an engine start) or K×R×W such as 3x3x2 (W ≥ 1 replays of the workload per start), "
                             "or 0 to skip")
    return ConfirmPlan(int(m.group(1)), int(m.group(2)), int(m.group(3) or DEFAULT_REPLAYS))


def runner_factory(log_dir: Path, first_run: int = 0) -> Callable[[Scenario], TrialRunner]:
    def make(scenario: Scenario) -> TrialRunner:
        return runner_for(scenario, log_dir, first_run)
    return make


def _run(coro: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await task
    return asyncio.run(main())


def context(storage: str, study: str | None, log_dir: Path | None) -> TrustContext:
    from autotuner.engine.registry import autotuner_home

    data = load_study(storage, study)
    store = open_store(storage)
    logs = log_dir or autotuner_home() / "logs" / data.scenario.name
    make = runner_factory(logs, FRESH_RUNS + len(data.trials))
    return TrustContext(store, data.name, make(data.scenario), data.scenario, make)


def print_confirm(report: ConfirmReport) -> None:
    if not report.candidates:
        typer.echo(f"study {report.study}: no SLO-feasible trial to confirm")
        return
    refs = (", and for comparison " + ", ".join(f"trial {n} ({report.labels.get(n, 'reference')})"
                                                for n in report.references) if report.references else "")
    typer.echo(f"study {report.study}: {report.runs} confirmation runs on {report.lifetimes} engine starts of trials "
               f"{', '.join(map(str, report.candidates))}{refs} (interleaved)")
    if report.split:
        shares = ", ".join(f"{m} {share:.0%}" for m, share in report.split.items())
        typer.echo(f"  within one engine start: {shares} of the run-to-run spread; replays per start by round: "
                   f"{' '.join(map(str, report.replays))}")
    for number in report.candidates + report.references:
        c = report.summaries.get(number)
        if c is None:
            continue
        parts = [f"{name} mean {iv.describe()}" for m, name in (("output_tokens_per_s", "output tok/s"),
                                                                 ("ttft_p95_s", "TTFT p95 s"),
                                                                 ("itl_p99_s", "ITL p99 s"))
                 if (iv := c.intervals.get(m)) is not None]
        peak = "-" if c.worst_peak_fraction is None else f"{c.worst_peak_fraction:.1%}"
        typer.echo(f"  trial {number}: " + "; ".join(parts) + f"; worst memory peak {peak}"
                   + ("; n counts its search run (nothing picked it for luck)" if c.search_run else "")
                   + (f"; {len(c.bad_runs)} run(s) failed: {c.bad_runs[0]}" if c.bad_runs else "")
                   + (f"; offload: {c.offload.get('reason')}" if c.offload else ""))
    for number, why in report.dropped.items():
        typer.echo(f"  trial {number} measured no more: {why}")
    for number in report.rejoined:
        typer.echo(f"  trial {number}, dropped by racing, ran the rounds it missed: every configuration that "
                   "beat it was refused on a bound, and a winner stands on every confirmation start")
    for number, original in report.backed_off.items():
        typer.echo(f"  trial {number} backs trial {original} off the memory wall: its flags with less "
                   "gpu-memory-utilization, as its memory peak bound alone refused it")
    if report.next_in_line:
        typer.echo(f"  none of the first candidates held up: trials {', '.join(map(str, report.next_in_line))}, "
                   "next in line, were confirmed too")
    if report.changed:
        typer.echo(f"the single-shot best (trial {report.single_shot_best}) was not the confirmed best "
                   f"(trial {report.confirmed_best})")
    elif report.confirmed_best is not None:
        typer.echo(f"confirmed best: trial {report.confirmed_best}")
    else:
        typer.echo("no candidate held up when re-measured: nothing confirmed")


def print_soak(report: SoakReport) -> None:
    for v in report.verdicts:
        where = ", on the engine of its last confirmation run" if v.after_confirm else ""
        head = f"soak of trial {v.original} (trial {v.trial}{where}): {'passed' if v.passed else 'FAILED'}"
        duration = "-" if v.duration_s is None else f"{v.duration_s:.0f} s"
        room = ", ".join(f"GPU {i} {h:.2f} GiB" for i, h in enumerate(v.headroom_gib)) or "-"
        p99 = (f"TTFT p99 {v.ttft_p99_s:.3f} s" if v.ttft_p99_s is not None else "TTFT p99 -") + \
            (f", ITL p99 {v.itl_p99_s * 1000:.1f} ms" if v.itl_p99_s is not None else ", ITL p99 -")
        typer.echo(f"{head} — {v.workload}; {duration}; {p99}; headroom {room}"
                   + (f"; {v.reason}" if v.reason else ""))
    if not report.verdicts:
        typer.echo("nothing soaked")
    elif report.passed is None:
        typer.echo("no candidate survived the soak: export will refuse; tune with a wider space or a lower "
                   "memory threshold")


def run_confirm(storage: str, study: str | None, top: int, repeats: int, log_dir: Path | None,
                replays: int = DEFAULT_REPLAYS) -> int:
    if top < 1 or repeats < 2 or replays < 1:
        raise UserInputError("--top must be ≥ 1, --repeats ≥ 2 (one engine start gives no interval) and --replays "
                             "≥ 1")
    ctx = context(storage, study, log_dir)
    print_confirm(_run(confirm(ctx, top, repeats, replays=replays)))
    return 0


def run_soak(storage: str, study: str | None, duration_s: float, flags: dict[str, FlagValue] | None,
             log_dir: Path | None) -> int:
    ctx = context(storage, study, log_dir)
    report = _run(soak(ctx, duration_s, flags))
    print_soak(report)
    return 0 if report.passed is not None else 1


# Configurations soaked in turn before the trust phase gives up, as `soak` does.
SOAK_TRIES = 3


async def after_tune(scenario: Scenario, store: Store, study_name: str, runner: TrialRunner,
                     runner_for: Callable[[Scenario], TrialRunner], plan: ConfirmPlan, duration_s: float,
                     on_event: Any = None) -> tuple[ConfirmReport | None, SoakReport | None]:
    """The trust phase of `tune`: confirm the top K R times, then soak the confirmed best."""
    if plan.top == 0:
        return None, None
    ctx = TrustContext(store, study_name, runner, scenario, runner_for, on_event or (lambda _k, _d: None))
    confirmed = await confirm(ctx, plan.top, plan.repeats, replays=plan.replays,
                              soak_s=duration_s if duration_s > 0 else None)
    if confirmed.confirmed_best is None or duration_s <= 0:
        return confirmed, None
    verdicts: list[SoakVerdict] = []
    for _ in range(SOAK_TRIES):
        # The best — after a failed soak the next — on R lifetimes (confirm.next_to_soak).
        best = await next_to_soak(ctx, confirmed, plan.repeats, "knee", duration_s)
        if best is None:
            break
        # Its soak on its last confirmation engine (a later verdict may be a backed-off configuration's that
        # did not end best, confirm.py), else one on an engine of its own.
        done = next((v for v in reversed(confirmed.soaked) if v.original == best.trial_number), None)
        if done is None or not done.passed:
            done = (await soak(ctx, duration_s, tries=1)).verdicts[0]
        verdicts.append(done)
        if done.passed:
            break
    # The failures that moved the soak on, first.
    failed = [v for v in confirmed.soaked if not v.passed and v not in verdicts]
    return confirmed, SoakReport(study_name, [*failed, *verdicts])


__all__ = ["DEFAULT_REPEATS", "DEFAULT_TOP", "ConfirmPlan", "after_tune", "parse_confirm", "run_confirm", "run_soak"]


def run_after_tune(scenario: Scenario, store: Store, study_name: str, runner: TrialRunner, log_dir: Path,
                   plan: ConfirmPlan, duration_s: float) -> int:
    make = runner_factory(log_dir, FRESH_RUNS)
    confirmed, soaked = _run(after_tune(scenario, store, study_name, runner, make, plan, duration_s))
    if confirmed is not None:
        print_confirm(confirmed)
    if soaked is not None:
        print_soak(soaked)
    return 0
