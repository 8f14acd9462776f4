"""The `autotuner` command: the only place where parts are wired together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from autotuner import __version__

app = typer.Typer(
    name="autotuner",
    help="Closed-loop tuning of vLLM serving flags against runtime CUDA OOM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sim_app = typer.Typer(
    help="A simulated `vllm serve` on GPUs this machine does not have.",
    no_args_is_help=True,
)
app.add_typer(sim_app, name="sim")

LOG_FORMAT_HELP = ("auto: on a terminal a live view and warnings only, piped JSON lines; console; json "
                   "(every event as JSON lines on stderr). The full log is always in $AUTOTUNER_HOME/logs/NAME.jsonl")


# The simulator's commands take vLLM's own command line: argparse parses it, as vLLM does.
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@sim_app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)
def sim_serve(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-gpu G --sim-gpus N --sim-speedup X --sim-seed S]: serve like vLLM."""
    from autotuner.sim.cli import run_serve

    raise typer.Exit(run_serve(ctx.args))


@sim_app.command("evaluate", context_settings=_PASSTHROUGH, add_help_option=False)
def sim_evaluate(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-*] [workload flags] [--json]: the engine in virtual time."""
    from autotuner.sim.cli import run_evaluate

    raise typer.Exit(run_evaluate(ctx.args))


@sim_app.command("hold", context_settings=_PASSTHROUGH, add_help_option=False)
def sim_hold(ctx: typer.Context) -> None:
    """--gpu I --mib N [--unlisted]: hold simulated GPU memory as a foreign process until killed."""
    from autotuner.sim.cli import run_hold

    raise typer.Exit(run_hold(ctx.args))


def _fail(exc: Exception) -> typer.Exit:
    """Bad input: one clear message, exit code 2, nothing written."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


def _preflight(sc: object, storage: str | None, log_dir: Path | None, overrides: dict | None = None) -> None:
    """Checks before anything is launched or written: failures raise PreflightError (exit 2),
    warnings go to stderr."""
    from autotuner.preflight import preflight

    report = preflight(sc, storage=storage, log_dir=log_dir, overrides=overrides)  # type: ignore[arg-type]
    for check in report.warnings:
        typer.echo(f"warning: {check.line()}", err=True)


@app.command(epilog="Exit status: 0 the outcome is ok; 1 any other outcome (OOM, startup failure, "
             "invalid flags, crash, timeout); 2 bad input or a failed preflight check (nothing launched); "
             "130 interrupted.", context_settings={"allow_extra_args": True})
def measure(
    ctx: typer.Context,
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    set_: list[str] = typer.Option([], "--set", help="NAME=VALUE: a vLLM long option without dashes; "
                                   "true/false for booleans (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout (the "
                                 "table goes to stderr)"),
    json_out: Path | None = typer.Option(None, "-o", "--output", help="also write the result as one JSON "
                                         "object to this file"),
    log_dir: Path | None = typer.Option(None, help="where engine logs go (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Measure one configuration: start the engine, replay the workload, watch memory, stop, report.

    Exit status: 0 ok; 1 any other outcome; 2 bad input or a failed preflight check; 130 interrupted."""
    import asyncio
    import signal

    from autotuner.engine.launch import parse_set
    from autotuner.engine.registry import autotuner_home
    from autotuner.errors import UserInputError
    from autotuner.scenario import load_scenario

    configure_logging()
    try:
        scenario, json_out, as_json = old_json_path(scenario, json_out, as_json, ctx.args)
        sc = load_scenario(scenario)
        overrides = parse_set(set_)
        if json_out is not None and not json_out.parent.is_dir():
            raise UserInputError(f"--output {json_out}: directory {json_out.parent} does not exist")
        logs = log_dir or autotuner_home() / "logs" / sc.name
        _preflight(sc, None, logs, overrides)
    except UserInputError as exc:
        raise _fail(exc) from None
    log_to_file(sc.name, False)
    from autotuner.backends import backend_for
    from autotuner.engine.gpu_locks import GpusBusyError
    from autotuner.trial_view import print_trial
    from autotuner.tuner.lifecycle import measure as measure_trial

    async def main() -> object:
        backend = backend_for(sc)
        if not backend.runs_process:  # evaluated here, in virtual time
            from autotuner.tuner.runners import VirtualRunner, runner_for

            runner = runner_for(sc, logs)
            assert isinstance(runner, VirtualRunner)
            return runner.evaluate(overrides)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        return await measure_trial(sc, overrides, log_dir=logs,
                                   on_phase=lambda p: typer.echo(f"[{p}]", err=True))

    from autotuner.view.requests import request_bar

    try:
        with request_bar():
            result = asyncio.run(main())
    except (UserInputError, GpusBusyError) as exc:
        raise _fail(exc) from None
    except FileNotFoundError as exc:  # the command vanished between the preflight and the launch
        raise _fail(UserInputError(f"engine.command: {exc.filename or exc}: no such file; set engine.command "
                                   "to the engine's full path")) from None
    except asyncio.CancelledError:
        typer.echo("interrupted: the engine was stopped", err=True)
        raise typer.Exit(130) from None
    from rich.console import Console

    print_trial(result, Console(stderr=as_json))  # type: ignore[arg-type]
    if json_out is not None:
        write_json_atomic(json_out, result.to_dict())  # type: ignore[attr-defined]
    if as_json:
        import json

        typer.echo(json.dumps(result.to_dict(), default=str))  # type: ignore[attr-defined]
    raise typer.Exit(0 if result.outcome == "ok" else 1)  # type: ignore[attr-defined]


def old_json_path(scenario: Path, output: Path | None, as_json: bool, extra: list[str]) -> tuple[Path, Path | None,
                                                                                             bool]:
    """`measure SCENARIO --json PATH` (before 0.2) still writes PATH, with a note: `--json` now prints to
    stdout and `-o/--output PATH` writes a file, as in `vllm bench serve` and `export`."""
    from autotuner.errors import UserInputError

    if not extra:
        return scenario, output, as_json
    if not as_json or len(extra) != 1 or output is not None:
        raise UserInputError(f"unexpected argument(s) {' '.join(extra)}: measure takes one scenario file")
    path = Path(extra[0])
    if scenario.suffix == ".json" and path.suffix in (".yaml", ".yml"):  # `--json out.json scenario.yaml`
        scenario, path = path, scenario
    typer.echo(f"note: `--json {path}` is deprecated: use `-o {path}` (a file) or `--json` (stdout)", err=True)
    return scenario, path, False


@app.command()
def verify(
    base_url: str = typer.Option(..., "--base-url", help="the endpoint, e.g. http://127.0.0.1:8000"),
    model: str | None = typer.Option(None, help="served model name (default: the only one served)"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="variable holding the API key"),
    scenario: Path | None = typer.Option(None, "--scenario", help="use this scenario's workload"),
) -> None:
    """Check a running endpoint with concurrent long prompts; exit 0 when every request succeeded."""
    from autotuner.errors import UserInputError
    from autotuner.scenario import load_scenario
    from autotuner.verify import run_verify

    configure_logging()
    try:
        sc = load_scenario(scenario) if scenario is not None else None
        from autotuner.view.requests import request_bar

        with request_bar():
            verdict = run_verify(base_url, model, api_key_env, sc)
    except UserInputError as exc:
        raise _fail(exc) from None
    for note in verdict.notes:
        typer.echo(f"note: {note}")
    m = verdict.metrics
    if m:
        typer.echo(f"model {verdict.model}: {m.get('completed')} ok, {m.get('failed')} failed; "
                   f"TTFT p50 {_s(m.get('ttft_p50_s'))}, p95 {_s(m.get('ttft_p95_s'))}; "
                   f"output {_n(m.get('output_tokens_per_s'))} tok/s")
    if verdict.memory is not None:
        peaks = ", ".join(f"GPU {d.index} {p / 2**30:.2f} GiB" for d, p in
                          zip(verdict.memory.devices, verdict.memory.peak_bytes, strict=True))
        typer.echo(f"memory peak during the check: {peaks}")
    for problem in verdict.problems:
        typer.echo(f"problem: {problem}", err=True)
    raise typer.Exit(0 if verdict.ok else 1)


@app.command("init", epilog="Exit status: 0 files written; 2 bad input (unparsable command line, unknown flag, "
             "unreachable endpoint, a file that exists without --force): nothing written.")
def init(
    from_cmd: str | None = typer.Option(None, "--from-cmd", help="the command that starts production, quoted: "
                                        "'vllm serve MODEL --tensor-parallel-size 8 ...'"),
    from_endpoint: str | None = typer.Option(None, "--from-endpoint", help="a running vLLM, e.g. "
                                             "http://127.0.0.1:8000: model, context and traffic lengths"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="variable holding the endpoint's API key"),
    out: Path = typer.Option(Path("."), "--out", help="directory for scenario.yaml and autotuner-daemon.yaml"),
    force: bool = typer.Option(False, "--force", help="replace an existing scenario.yaml / autotuner-daemon.yaml"),
) -> None:
    """Write a scenario and a daemon config from what you already run (command line and/or endpoint)."""
    from autotuner.errors import UserInputError
    from autotuner.init import run_init

    try:
        result = run_init(from_cmd, from_endpoint, api_key_env=api_key_env, out=out, force=force)
    except UserInputError as exc:
        raise _fail(exc) from None
    for line in result.inferred:
        typer.echo(f"inferred: {line}")
    for line in result.check:
        typer.echo(f"check: {line}")
    typer.echo(f"wrote {result.scenario_path} and {result.daemon_path}")


@app.command(epilog="Exit status: 0 the trial budget or the time budget ran out (or the space was "
             "exhausted), or SIGINT/SIGTERM stopped it cleanly (the summary says interrupted; run the same "
             "command again to resume); 1 stopped by the circuit breaker (machine faults, e.g. a broken driver "
             "or a missing model; the reason is printed); 2 bad input or a failed preflight check (nothing "
             "launched, nothing written).")
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
    confirm_plan: str = typer.Option("3x3", "--confirm", help="then re-measure the top K R times each (K×R); "
                                     "0 skips confirmation and soak"),
    soak_for: str = typer.Option("10m", "--soak", help="then soak the confirmed best under the worst workload "
                                 "this long (engine time; 0 skips)"),
    gpu_groups: str = typer.Option("auto", "--gpu-groups", help="trials side by side on disjoint GPU groups when "
                                   "one needs fewer GPUs than the box has: auto (as many as fit), N, or off"),
) -> None:
    """Tune the scenario's flags: an Optuna study over engine lifetimes, stored in SQLite.

    Exit status: 0 budget or time ran out, or interrupted cleanly; 1 stopped by the circuit breaker;
    2 bad input or a failed preflight check."""
    import asyncio
    import signal

    from autotuner.engine.registry import autotuner_home
    from autotuner.errors import UserInputError
    from autotuner.scenario import load_scenario

    configure_logging(log_format, quiet)
    try:
        sc = load_scenario(scenario)
        if trials is not None and trials < 1:
            raise UserInputError("--trials must be ≥ 1")
        logs = log_dir or autotuner_home() / "logs" / sc.name
        _preflight(sc, storage or sc.storage, logs)
        # After the preflight: a broken setup is refused in a second, before Optuna is even imported.
        from autotuner.durations import parse_duration
        from autotuner.engine.gpu_locks import GpusBusyError
        from autotuner.store.db import Store, storage_error
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
                      warm_start=warm_start, gpu_groups=groups)
    except UserInputError as exc:
        raise _fail(exc) from None
    log_to_file(tuner.study_name, quiet)
    view = live_view(tuner, log_format, quiet)

    async def main() -> object:
        loop = asyncio.get_running_loop()
        # SIGHUP too: a closed terminal or tmux session must stop the engine, not orphan it.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, tuner.request_stop)
        return await tuner.run()

    try:
        if view is not None:
            with view:
                summary = asyncio.run(main())
        else:
            summary = asyncio.run(main())
    except (UserInputError, GpusBusyError) as exc:
        raise _fail(exc) from None
    except Exception as exc:
        # The database failed under the study (disk full, locked, read-only): say so once, no traceback.
        failure = storage_error(exc, store.url)
        if failure is None:
            raise
        typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(1) from None
    _print_summary(summary, store.url)
    if not summary.interrupted and summary.stopped_reason is None:  # type: ignore[attr-defined]
        try:
            run_after_tune(sc, store, summary.study_name, runner, logs, *trust_plan, soak_s)  # type: ignore[attr-defined]
        except (UserInputError, GpusBusyError) as exc:
            raise _fail(exc) from None
    raise typer.Exit(summary.exit_code)  # type: ignore[attr-defined]


def _print_summary(s: Any, storage: str = "sqlite:///autotuner.db") -> None:  # a TuneSummary
    from autotuner.secrets import display_url

    where = "" if storage == DEFAULT_STORAGE else f" --storage {display_url(storage)}"
    if s.interrupted:
        state = "interrupted"
    elif s.stopped_reason is not None:
        state = f"stopped: {s.stopped_reason}"
    else:
        state = {"timeout": "done (time budget ran out)",
                 "space-exhausted": "done (no candidate left worth launching)"}.get(s.ended, "done")
    typer.echo(f"study {s.study_name}: {state}, {s.trials_done}/{s.trials_budget} trials, "
               f"{s.oom_trials} hit OOM, sampler {s.sampler}")
    if s.gpu_groups:
        typer.echo(f"trials side by side on {len(s.gpu_groups)} GPU groups: " + " | ".join(s.gpu_groups))
    if s.baseline is not None:
        typer.echo(f"baseline (vLLM defaults): trial {s.baseline['number']}, {s.baseline['outcome']}")
    for best in s.best[:10]:
        values = ", ".join(f"{v:.4g}" for v in best["values"])
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        typer.echo(f"pareto: trial {best['number']}: [{values}] {params}")
    if s.best:
        typer.echo(f"next: autotuner export --study {s.study_name}{where} --format yaml   |   "
                   f"autotuner report --study {s.study_name}{where} -o report/")
    elif s.stopped_reason is not None or s.interrupted:
        typer.echo("no feasible configuration yet: fix the cause and run the same command again to resume",
                   err=True)
    else:
        typer.echo(f"no feasible configuration found: autotuner report --study {s.study_name}{where} -o report/ "
                   "shows why each trial failed", err=True)


@app.command(epilog="Exit status: 0 every check ok; 1 warnings only; 2 a check failed (tune and measure "
             "would refuse to start).")
def doctor(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    storage: str | None = typer.Option(None, "--storage", help="SQLite path or SQLAlchemy URL (default: the "
                                       "scenario's)"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Check what a run of SCENARIO needs, without launching or writing anything: the engine command and
    its vLLM version, the model, GPUs and their foreign memory, flags, workload vs context, storage,
    log disk, host RAM, proxy variables. Exit 0 all ok, 1 warnings only, 2 something failed."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from autotuner.engine.registry import autotuner_home
    from autotuner.errors import UserInputError
    from autotuner.preflight import run_checks
    from autotuner.scenario import load_scenario

    try:
        sc = load_scenario(scenario)
    except UserInputError as exc:
        raise _fail(exc) from None
    report = run_checks(sc, storage=storage or sc.storage,
                        log_dir=log_dir or autotuner_home() / "logs" / sc.name)
    table = Table(title=f"autotuner doctor {scenario}", show_lines=False)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    style = {"ok": "green", "warning": "yellow", "failed": "bold red"}
    for check in report.checks:
        table.add_row(check.name, Text(check.status, style=style[check.status]), Text(check.detail),
                      Text(check.fix or ""))
    Console(width=max(Console().width, 160)).print(table)
    raise typer.Exit(report.exit_code)


DEFAULT_STORAGE = "sqlite:///autotuner.db"


@app.command()
def confirm(
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    top: int = typer.Option(3, "--top", help="candidates: the SLO-feasible Pareto front and its neighbours"),
    repeats: int = typer.Option(3, "--repeats", help="runs of each candidate, interleaved A B C A B C"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Re-measure the best candidates; mean and 95 % interval per objective, worst memory peak."""
    from autotuner.engine.gpu_locks import GpusBusyError
    from autotuner.errors import UserInputError
    from autotuner.trust.commands import run_confirm

    configure_logging()
    try:
        raise typer.Exit(run_confirm(storage, study, top, repeats, log_dir))
    except (UserInputError, GpusBusyError) as exc:
        raise _fail(exc) from None


@app.command()
def soak(
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    set_: list[str] = typer.Option([], "--set", help="NAME=VALUE: soak these flags instead of the confirmed best"),
    duration: str = typer.Option("10m", "--duration", help="how long, in engine time (e.g. 10m)"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Run the confirmed best under the worst workload the scenario allows; the next one if it fails."""
    from autotuner.durations import parse_duration
    from autotuner.engine.gpu_locks import GpusBusyError
    from autotuner.engine.launch import parse_set
    from autotuner.errors import UserInputError
    from autotuner.trust.commands import run_soak

    configure_logging()
    try:
        seconds = parse_duration(duration) or 0.0
        if seconds <= 0:
            raise UserInputError("--duration must be > 0, e.g. 10m")
        raise typer.Exit(run_soak(storage, study, seconds, parse_set(set_) if set_ else None, log_dir))
    except (UserInputError, GpusBusyError) as exc:
        raise _fail(exc) from None


@app.command()
def status(
    study: str | None = typer.Argument(None, help="a study: list its trials"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    watch: bool = typer.Option(False, "--watch", "-w", help="follow a running study (STUDY required): the "
                               "live table of `tune`, refreshed from the database until Ctrl-C"),
    interval: float = typer.Option(2.0, "--interval", help="seconds between refreshes with --watch"),
) -> None:
    """Studies in the storage and their trials; --watch follows a running study from another terminal."""
    from autotuner.errors import UserInputError
    from autotuner.export.status import run_status

    try:
        if watch:
            raise typer.Exit(watch_status(storage, study, interval))
        raise typer.Exit(run_status(storage, study))
    except UserInputError as exc:
        raise _fail(exc) from None


def watch_status(storage: str, study: str | None, interval: float) -> int:
    from autotuner.errors import UserInputError
    from autotuner.export.status import watch

    if study is None:
        raise UserInputError("status --watch needs a study: autotuner status STUDY --watch")
    if not interval > 0:
        raise UserInputError(f"--interval {interval}: must be a positive number of seconds")
    try:
        return watch(storage, study, interval_s=interval)
    except KeyboardInterrupt:
        return 0


@app.command()
def export(
    fmt: str = typer.Option(..., "--format", help="cmd | yaml | compose | systemd | env | json"),
    output: Path | None = typer.Option(None, "-o", "--output", help="file to write (default: stdout)"),
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    slo: list[str] = typer.Option([], "--slo", help="e.g. 'ttft_p95<=2s' (repeatable; on top of the "
                                  "scenario's SLOs)"),
    policy: str = typer.Option("knee", "--policy", help="max-throughput | min-ttft | knee"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    force: bool = typer.Option(False, "--force", help="export even if this machine's GPUs or the model "
                               "differ from the study's"),
    allow_unverified: bool = typer.Option(False, "--allow-unverified", help="export a winner that was not "
                                          "confirmed and soaked (the certificate says so)"),
) -> None:
    """Export the chosen Pareto config as a deployment artefact, with its certificate."""
    from autotuner.errors import UserInputError
    from autotuner.export.exporter import run_export

    try:
        raise typer.Exit(run_export(storage, study, slo, policy, fmt, output, force, allow_unverified))
    except UserInputError as exc:
        raise _fail(exc) from None


@app.command()
def report(
    output: Path = typer.Option(..., "-o", "--output", help="directory for report.md, report.html, PNGs"),
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
) -> None:
    """Markdown and HTML report: Pareto front, trials, baseline against winner, memory timeline."""
    from autotuner.errors import UserInputError
    from autotuner.export.report import run_report

    try:
        raise typer.Exit(run_report(storage, study, output))
    except UserInputError as exc:
        raise _fail(exc) from None


def _s(value: object) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _n(value: object) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_json_atomic(path: Path, payload: object) -> None:
    import json

    from autotuner.export.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")


def configure_logging(log_format: str = "auto", quiet: bool = False) -> None:
    from autotuner.logs import configure

    if log_format not in ("auto", "console", "json"):
        typer.echo(f"error: --log-format {log_format}: use auto, console or json", err=True)
        raise typer.Exit(2)
    configure(log_format=log_format, quiet=quiet)  # type: ignore[arg-type]


def log_to_file(name: str, quiet: bool) -> None:
    """Every event of this run, as JSON lines, in $AUTOTUNER_HOME/logs/NAME.jsonl; its path is said first."""
    from autotuner.engine.registry import autotuner_home
    from autotuner.logs import attach_file, log_file_for

    path = attach_file(log_file_for(autotuner_home(), name))
    if path is not None and not quiet:
        typer.echo(f"log: {path}", err=True)


def live_view(tuner: Any, log_format: str, quiet: bool) -> Any:
    """The Rich live view on a terminal (None when piped, quiet or asked for JSON): it hears the Tuner's
    events and the memory sampler's peaks."""
    import sys

    from autotuner.monitor.sampler import memory_listener
    from autotuner.tuner.progress import LiveView
    from autotuner.workload.replay import request_listener

    if quiet or log_format == "json" or not sys.stderr.isatty():
        return None
    sc = tuner.scenario
    view = LiveView([o.metric for o in sc.objectives], [o.direction for o in sc.objectives], tuner.timeout_s)
    tuner.on_event = view
    memory_listener.set(view)  # asyncio.run copies this context into the study's tasks
    request_listener.set(view)
    return view


@app.command()
def version() -> None:
    """Print the autotuner version."""
    typer.echo(__version__)


def main() -> None:
    app()


daemon_app = typer.Typer(help="Watch production, re-tune when it changes, roll the winner out, roll back on failure.",
                         no_args_is_help=True)
app.add_typer(daemon_app, name="daemon")


@daemon_app.command("run", epilog="Signals: SIGTERM finishes or rolls back the step in flight, then exits 0; SIGHUP "
                    "reloads CONFIG. Exit status: 0 stopped cleanly; 2 bad CONFIG (nothing started).")
def daemon_run(
    config: Path = typer.Argument(..., help="daemon config YAML (see the README's daemon section)"),
    log_format: str = typer.Option("json", "--log-format", help=LOG_FORMAT_HELP),
) -> None:
    """Run the daemon in the foreground (as a systemd or compose service)."""
    from autotuner.errors import UserInputError

    configure_logging(log_format)
    try:
        from autotuner.daemon.runner import Daemon

        daemon = Daemon(config)
    except UserInputError as exc:
        raise _fail(exc) from None
    log_to_file(f"{daemon.states.deployment}-daemon", True)
    import asyncio

    try:
        code = asyncio.run(daemon.run())
    except UserInputError as exc:
        raise _fail(exc) from None
    raise typer.Exit(code)


@daemon_app.command("status")
def daemon_status(
    config: Path = typer.Argument(..., help="daemon config YAML"),
    as_json: bool = typer.Option(False, "--json", help="print what GET /status answers, as JSON"),
) -> None:
    """What the daemon is doing and has done, read from its database (the same facts as GET /status)."""
    from autotuner.errors import UserInputError

    try:
        from autotuner.daemon.config import load_config
        from autotuner.daemon.state import CycleStore
        from autotuner.daemon.status import status_document, status_lines
        loaded = load_config(config)
        states = CycleStore(_daemon_store(loaded), loaded.scenario.name)
        doc = status_document(states, loaded.config)
    except UserInputError as exc:
        raise _fail(exc) from None
    if as_json:
        import json

        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        for line in status_lines(doc):
            typer.echo(line)


def _daemon_store(loaded: Any) -> Any:
    from autotuner.errors import UserInputError
    from autotuner.store.db import Store, sqlalchemy_url

    url = sqlalchemy_url(loaded.config.storage_url())
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserInputError(f"storage {url.removeprefix('sqlite:///')}: no database yet — has `autotuner daemon "
                             "run` started with this config?")
    return Store(url)
