"""`autotuner init`, `doctor` and `verify`: around a tune rather than in it — write a scenario from
what production runs, check that a run of it can start, check a running endpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import configure_logging, default_log_dir

INIT_EPILOG = ("Exit status: 0 files written; 2 bad input (unparsable command line, unknown flag, unreachable "
               "endpoint, a file that exists without --force): nothing written.")
DOCTOR_EPILOG = ("Exit status: 0 every check ok; 1 warnings only; 2 a check failed (tune and measure would refuse "
                 "to start).")


def verify(
    base_url: str = typer.Option(..., "--base-url", help="the endpoint, e.g. http://127.0.0.1:8000"),
    model: str | None = typer.Option(None, help="served model name (default: the only one served)"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="variable holding the API key"),
    scenario: Path | None = typer.Option(None, "--scenario", help="use this scenario's workload"),
) -> None:
    """Check a running endpoint with concurrent long prompts; exit 0 when every request succeeded."""
    from autotuner.scenario import load_scenario  # start-up time, as the imports below
    from autotuner.verify import run_verify
    from autotuner.view.request_bar import request_bar

    configure_logging()
    with command_errors():
        sc = load_scenario(scenario) if scenario is not None else None
        with request_bar():
            verdict = run_verify(base_url, model, api_key_env, sc)
    for note in verdict.notes:
        typer.echo(f"note: {note}")
    m = verdict.metrics
    if m:
        typer.echo(f"model {verdict.model}: {m.get('completed')} ok, {m.get('failed')} failed; "
                   f"TTFT p50 {_seconds(m.get('ttft_p50_s'))}, p95 {_seconds(m.get('ttft_p95_s'))}; "
                   f"output {_number(m.get('output_tokens_per_s'))} tok/s")
    if verdict.memory is not None:
        peaks = ", ".join(f"GPU {d.index} {p / 2**30:.2f} GiB" for d, p in
                          zip(verdict.memory.devices, verdict.memory.peak_bytes, strict=True))
        typer.echo(f"memory peak during the check: {peaks}")
    for problem in verdict.problems:
        typer.echo(f"problem: {problem}", err=True)
    raise typer.Exit(0 if verdict.ok else 1)


def _seconds(value: object) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _number(value: object) -> str:
    return "-" if value is None else f"{value:.1f}"


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
    from autotuner.init import run_init  # start-up time

    with command_errors():
        result = run_init(from_cmd, from_endpoint, api_key_env=api_key_env, out=out, force=force)
    for line in result.inferred:
        typer.echo(f"inferred: {line}")
    for line in result.check:
        typer.echo(f"check: {line}")
    typer.echo(f"wrote {result.scenario_path} and {result.daemon_path}")
    for line in plan_lines(result.daemon_path):
        typer.echo(f"check: {line}")


def plan_lines(daemon_path: Path) -> list[str]:
    """What a cycle of the daemon config init wrote would do on this box, and why it could not complete
    (`autotuner daemon plan`): init writes the config; this says whether it can work."""
    try:
        from autotuner.daemon.plan import plan_cycle
    except ImportError:  # an install without the daemon's planner
        return [f"run `autotuner daemon plan {daemon_path}` to see what a cycle would do"]
    from autotuner.errors import AutotunerError

    try:
        plan = plan_cycle(daemon_path)
    except AutotunerError as exc:
        return [f"warning: {daemon_path} does not load as a daemon config: {exc}; fix it before "
                f"`autotuner daemon run {daemon_path}`"]
    lines = [f"cycle: {line}" for line in plan.lines]
    lines += [f"warning: a cycle cannot complete: {problem}" for problem in plan.problems]
    if not plan.can_complete and not plan.problems:
        lines.append(f"warning: a cycle cannot complete; see `autotuner daemon plan {daemon_path}`")
    return lines


def doctor(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    storage: str | None = typer.Option(None, "--storage", help="SQLite path or SQLAlchemy URL (default: the "
                                       "scenario's)"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Check what a run of SCENARIO needs, without launching or writing anything: the engine command and
    its vLLM version, the model, GPUs and their foreign memory, flags, workload vs context, storage,
    log disk, host RAM, proxy variables. Exit 0 all ok, 1 warnings only, 2 something failed."""
    from rich.console import Console  # start-up time, as the imports below
    from rich.table import Table
    from rich.text import Text

    from autotuner.preflight import run_checks
    from autotuner.scenario import load_scenario
    from autotuner.secrets import redact

    with command_errors():
        sc = load_scenario(scenario)
    report = run_checks(sc, storage=storage or sc.storage, log_dir=default_log_dir(sc, log_dir))
    table = Table(title=f"autotuner doctor {scenario}", show_lines=False)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    style = {"ok": "green", "warning": "yellow", "failed": "bold red"}
    for check in report.checks:
        # A check quotes what it looked at (an expanded engine.model, a URL): never a secret's value.
        table.add_row(check.name, Text(check.status, style=style[check.status]), Text(redact(check.detail)),
                      Text(redact(check.fix or "")))
    Console(width=max(Console().width, 160)).print(table)
    raise typer.Exit(report.exit_code)
