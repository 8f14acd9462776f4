"""The `autotuner` command: the only place where parts are wired together."""

from __future__ import annotations

from pathlib import Path

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


def _fail(exc: Exception) -> typer.Exit:
    """Bad input: one clear message, exit code 2, nothing written."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command()
def measure(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    set_: list[str] = typer.Option([], "--set", help="NAME=VALUE: a vLLM long option without dashes; "
                                   "true/false for booleans (repeatable)"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the result as one JSON object"),
    log_dir: Path | None = typer.Option(None, help="where engine logs go (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Measure one configuration: start the engine, replay the workload, watch memory, stop, report."""
    import asyncio
    import signal

    from autotuner.engine.launch import parse_set
    from autotuner.engine.registry import autotuner_home
    from autotuner.errors import UserInputError
    from autotuner.scenario import load_scenario
    from autotuner.trial_view import print_trial
    from autotuner.tuner.trial import GpusBusyError
    from autotuner.tuner.trial import measure as measure_trial

    configure_logging()
    try:
        sc = load_scenario(scenario)
        overrides = parse_set(set_)
        if json_out is not None and not json_out.parent.is_dir():
            raise UserInputError(f"--json {json_out}: directory {json_out.parent} does not exist")
    except UserInputError as exc:
        raise _fail(exc) from None
    logs = log_dir or autotuner_home() / "logs" / sc.name

    async def main() -> object:
        if sc.engine.kind == "sim-virtual":
            from autotuner.tuner.runner import VirtualRunner

            return VirtualRunner(sc).evaluate(overrides)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        return await measure_trial(sc, overrides, log_dir=logs,
                                   on_phase=lambda p: typer.echo(f"[{p}]", err=True))

    try:
        result = asyncio.run(main())
    except (UserInputError, GpusBusyError) as exc:
        raise _fail(exc) from None
    except asyncio.CancelledError:
        typer.echo("interrupted: the engine was stopped", err=True)
        raise typer.Exit(130) from None
    print_trial(result)  # type: ignore[arg-type]
    if json_out is not None:
        write_json_atomic(json_out, result.to_dict())  # type: ignore[attr-defined]


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
        verdict = run_verify(base_url, model, api_key_env, sc)
    except UserInputError as exc:
        raise _fail(exc) from None
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


@app.command()
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
    confirm_plan: str = typer.Option("3x3", "--confirm", help="then re-measure the top K R times each (K×R); "
                                     "0 skips confirmation and soak"),
    soak_for: str = typer.Option("10m", "--soak", help="then soak the confirmed best under the worst workload "
                                 "this long (engine time; 0 skips)"),
) -> None:
    """Tune the scenario's flags: an Optuna study over engine lifetimes, stored in SQLite."""
    import asyncio
    import signal
    import sys

    from autotuner.engine.registry import autotuner_home
    from autotuner.errors import UserInputError
    from autotuner.scenario import load_scenario
    from autotuner.store.db import Store
    from autotuner.trust.commands import parse_confirm, run_after_tune
    from autotuner.tuner.progress import LiveView
    from autotuner.tuner.runner import MeasureRunner, TrialRunner, VirtualRunner
    from autotuner.tuner.study import Tuner, parse_duration
    from autotuner.tuner.trial import GpusBusyError

    configure_logging()
    try:
        sc = load_scenario(scenario)
        if trials is not None and trials < 1:
            raise UserInputError("--trials must be ≥ 1")
        timeout_s = parse_duration(timeout) if timeout is not None else None
        trust_plan, soak_s = parse_confirm(confirm_plan), parse_duration(soak_for) or 0.0
        store = Store(storage or sc.storage)
        logs = log_dir or autotuner_home() / "logs" / sc.name
        runner: TrialRunner = VirtualRunner(sc) if sc.engine.kind == "sim-virtual" else MeasureRunner(sc, logs)
        view = LiveView([o.metric for o in sc.objectives], timeout_s) if sys.stderr.isatty() else None
        tuner = Tuner(sc, runner, store, study_name=study, n_trials=trials, timeout_s=timeout_s, seed=seed,
                      on_event=view, warm_start=warm_start)
    except UserInputError as exc:
        raise _fail(exc) from None

    async def main() -> object:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
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
    _print_summary(summary)
    if not summary.interrupted:  # type: ignore[attr-defined]
        try:
            raise typer.Exit(run_after_tune(sc, store, summary.study_name, runner, logs, *trust_plan, soak_s))  # type: ignore[attr-defined]
        except (UserInputError, GpusBusyError) as exc:
            raise _fail(exc) from None


def _print_summary(summary: object) -> None:
    s = summary  # TuneSummary
    state = "interrupted" if s.interrupted else "done"  # type: ignore[attr-defined]
    typer.echo(f"study {s.study_name}: {state}, {s.trials_done}/{s.trials_budget} trials, "  # type: ignore[attr-defined]
               f"{s.oom_trials} hit OOM, sampler {s.sampler}")  # type: ignore[attr-defined]
    if s.baseline is not None:  # type: ignore[attr-defined]
        typer.echo(f"baseline (vLLM defaults): trial {s.baseline['number']}, {s.baseline['outcome']}")  # type: ignore[attr-defined]
    for best in s.best[:10]:  # type: ignore[attr-defined]
        values = ", ".join(f"{v:.4g}" for v in best["values"])
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        typer.echo(f"pareto: trial {best['number']}: [{values}] {params}")
    typer.echo(f"next: autotuner export --study {s.study_name} --format yaml   |   "  # type: ignore[attr-defined]
               f"autotuner report --study {s.study_name} -o report/")  # type: ignore[attr-defined]


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
    from autotuner.errors import UserInputError
    from autotuner.trust.commands import run_confirm
    from autotuner.tuner.trial import GpusBusyError

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
    from autotuner.engine.launch import parse_set
    from autotuner.errors import UserInputError
    from autotuner.trust.commands import run_soak
    from autotuner.tuner.study import parse_duration
    from autotuner.tuner.trial import GpusBusyError

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
) -> None:
    """Studies in the storage and their trials."""
    from autotuner.errors import UserInputError
    from autotuner.export.status import run_status

    try:
        raise typer.Exit(run_status(storage, study))
    except UserInputError as exc:
        raise _fail(exc) from None


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


def configure_logging() -> None:
    from autotuner.logs import configure

    configure()


@app.command()
def version() -> None:
    """Print the autotuner version."""
    typer.echo(__version__)


def main() -> None:
    app()
