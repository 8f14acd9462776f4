"""`autotuner tune`: the study over engine lifetimes, its live view on a terminal, its summary, then
the confirmation and soak of the winner."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import (
    DEFAULT_STORAGE,
    LOG_FORMAT_HELP,
    configure_logging,
    default_log_dir,
    log_to_file,
    warn_preflight,
)
from autotuner.errors import UserInputError
from autotuner.twin import TWIN_FIRST

if TYPE_CHECKING:
    from autotuner.tuner.study import Tuner
    from autotuner.tuner.tune_summary import TuneSummary
    from autotuner.view.live import LiveView

TUNE_EPILOG = ("Exit status: 0 the trial budget or the time budget ran out (or the space was exhausted), or "
               "SIGINT/SIGTERM stopped it cleanly (the summary says interrupted; run the same command again to "
               "resume); 1 stopped by the circuit breaker (machine faults, e.g. a broken driver or a missing model; "
               "the reason is printed); 2 bad input or a failed preflight check (nothing launched, nothing "
               "written).")


def tune(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    trials: int | None = typer.Option(None, "--trials", help="study-wide number of completed trials"),
    timeout: str | None = typer.Option(None, "--timeout", help="wall-clock budget of this run, e.g. 8h"),
    storage: str | None = typer.Option(None, "--storage", help="SQLite path or SQLAlchemy URL"),
    study: str | None = typer.Option(None, "--study", help="study name (default: derived from its key)"),
    seed: int = typer.Option(0, "--seed", help="sampler seed"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
    warm_start: str | None = typer.Option(None, "--warm-start", help="start from this study's best configs "
                                          "(e.g. the study of the model you just replaced)"),
    log_format: str = typer.Option("auto", "--log-format", help=LOG_FORMAT_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print the summary only (the log file has the rest)"),
    confirm_plan: str = typer.Option("3x3", "--confirm", help="then re-measure the top K on R engine starts "
                                     "each (K×R), replaying the workload up to W times per start (K×R×W, W default "
                                     "2); 0 skips confirmation and soak"),
    soak_for: str = typer.Option("10m", "--soak", help="then soak the confirmed best under the worst workload "
                                 "this long (engine time; 0 skips)"),
    gpu_groups: str = typer.Option("auto", "--gpu-groups", help="trials side by side on disjoint GPU groups when "
                                   "one needs fewer GPUs than the box has: auto (as many as fit), N, or off"),
    twin: bool = typer.Option(TWIN_FIRST, "--twin/--no-twin", help="twin-first (the default): after the baseline, "
                              "search a simulator calibrated on this box's trials and measure only its finalists (GPUs "
                              "the simulator has a preset for, synthetic workloads; elsewhere the sampler's search; "
                              "`autotuner twin` shows it); --no-twin: the sampler's search only"),
) -> None:
    """Tune the scenario's flags: an Optuna study over engine lifetimes, stored in SQLite.

    Exit status: 0 budget or time ran out, or interrupted cleanly; 1 stopped by the circuit breaker;
    2 bad input or a failed preflight check."""
    import asyncio  # start-up time, as the imports below

    from autotuner.scenario import load_scenario

    configure_logging(log_format, quiet)
    with command_errors():
        sc = load_scenario(scenario)
        if trials is not None and trials < 1:
            raise UserInputError("--trials must be ≥ 1")
        logs = default_log_dir(sc, log_dir)
        warn_preflight(sc, storage or sc.storage, logs)
        # After the preflight: a broken setup is refused in a second, before Optuna is even imported.
        from autotuner.durations import parse_duration
        from autotuner.store.db import Store
        from autotuner.trust.commands import parse_confirm, run_after_tune
        from autotuner.tuner.groups import parse_setting, plan_groups
        from autotuner.tuner.runners import runner_for
        from autotuner.tuner.space import build_space
        from autotuner.tuner.study import Tuner

        groups = parse_setting(gpu_groups)
        if isinstance(groups, int):
            plan_groups(sc, groups)  # more groups than fit is bad input, before the database is created
        timeout_s = parse_duration(timeout) if timeout is not None else None
        trust_plan, soak_s = parse_confirm(confirm_plan), parse_duration(soak_for) or 0.0
        build_space(sc)  # a bad search space is refused before the database is created
        store = Store(storage or sc.storage)
        runner = runner_for(sc, logs)
        tuner = Tuner(sc, runner, store, study_name=study, n_trials=trials, timeout_s=timeout_s, seed=seed,
                      warm_start=warm_start, gpu_groups=groups, twin=twin)
    log_to_file(tuner.study_name, quiet)
    view = live_view(tuner, log_format, quiet)

    async def main() -> TuneSummary:
        loop = asyncio.get_running_loop()
        # SIGHUP too: a closed terminal or tmux session must stop the engine, not orphan it.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, tuner.request_stop)
        return await tuner.run()

    with command_errors(storage_url=store.url):
        if view is not None:
            with view:
                summary = asyncio.run(main())
        else:
            summary = asyncio.run(main())
    print_summary(summary, store.url, [o.metric for o in sc.objectives])
    if not summary.interrupted and summary.stopped_reason is None:
        with command_errors():
            run_after_tune(sc, store, summary.study_name, runner, logs, trust_plan, soak_s)
    raise typer.Exit(summary.exit_code)


def print_summary(s: TuneSummary, storage: str = DEFAULT_STORAGE, objectives: list[str] | None = None) -> None:
    from autotuner.secrets import display_url  # SQLAlchemy: start-up time

    where = "" if storage == DEFAULT_STORAGE else f" --storage {display_url(storage)}"
    if s.interrupted:
        state = "interrupted"
    elif s.stopped_reason is not None:
        state = f"stopped: {s.stopped_reason}"
    else:
        state = {"timeout": "done (time budget ran out)",
                 "space-exhausted": "done (no candidate left worth launching)",
                 "twin-converged": "done (the twin's finalists measured as it predicted, nothing better predicted)",
                 }.get(s.ended, "done")
    typer.echo(f"study {s.study_name}: {state}, {s.trials_done}/{s.trials_budget} trials, "
               f"{s.oom_trials} hit OOM, sampler {s.sampler}")
    if s.twin:
        typer.echo(s.twin)
    if s.gpu_groups:
        typer.echo(f"trials side by side on {len(s.gpu_groups)} GPU groups: " + " | ".join(s.gpu_groups))
    if s.baseline is not None:
        typer.echo(f"baseline (vLLM defaults): trial {s.baseline['number']}, {s.baseline['outcome']}")
    for best in s.best[:10]:
        # Each value named: one run of the search, not yet re-measured (confirmation follows).
        names = objectives or [f"objective {i}" for i in range(len(best["values"]))]
        values = ", ".join(f"{n} {v:.4g}" for n, v in zip(names, best["values"], strict=False))
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        typer.echo(f"pareto: trial {best['number']} (one run): {values}; {params}")
    if s.best:
        typer.echo(f"next: autotuner export --study {s.study_name}{where} --format yaml   |   "
                   f"autotuner report --study {s.study_name}{where} -o report/")
    elif s.stopped_reason is not None or s.interrupted:
        typer.echo("no feasible configuration yet: fix the cause and run the same command again to resume",
                   err=True)
    else:
        typer.echo(f"no feasible configuration found: autotuner report --study {s.study_name}{where} -o report/ "
                   "shows why each trial failed", err=True)


def live_view(tuner: Tuner, log_format: str, quiet: bool) -> LiveView | None:
    """The Rich live view on a terminal (None when piped, quiet or asked for JSON): it hears the Tuner's
    events and the memory sampler's peaks."""
    from autotuner.monitor.sampler import memory_listener  # start-up time, as the imports below
    from autotuner.view.live import LiveView
    from autotuner.workload.replay import request_listener

    if quiet or log_format == "json" or not sys.stderr.isatty():
        return None
    sc = tuner.scenario
    view = LiveView([o.metric for o in sc.objectives], [o.direction for o in sc.objectives], tuner.timeout_s)
    tuner.on_event = view
    memory_listener.set(view)  # asyncio.run copies this context into the study's tasks
    request_listener.set(view)
    return view
