"""`autotuner measure`: one configuration, one engine lifetime, one result (a table on the terminal,
JSON on request)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotuner.backends import backend_for
from autotuner.cli.exits import command_errors, fail
from autotuner.cli.options import configure_logging, default_log_dir, log_to_file, warn_preflight
from autotuner.errors import UserInputError

if TYPE_CHECKING:
    from autotuner.scenario import Scenario
    from autotuner.trials.result import TrialResult
    from autotuner.vllm import FlagValue

MEASURE_EPILOG = ("Exit status: 0 the outcome is ok; 1 any other outcome (OOM, startup failure, invalid flags, "
                  "crash, timeout); 2 bad input or a failed preflight check (nothing launched); 130 interrupted.")


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
    import asyncio  # start-up time, as the imports below

    from autotuner.engine.launch import parse_set
    from autotuner.scenario import load_scenario

    configure_logging()
    with command_errors():
        scenario, json_out, as_json = old_json_path(scenario, json_out, as_json, ctx.args)
        sc = load_scenario(scenario)
        overrides = parse_set(set_)
        if json_out is not None and not json_out.parent.is_dir():
            raise UserInputError(f"--output {json_out}: directory {json_out.parent} does not exist")
        logs = default_log_dir(sc, log_dir)
        warn_preflight(sc, None, logs, overrides)
    log_to_file(sc.name, False)
    from rich.console import Console  # start-up time, as the imports below

    from autotuner.view.request_bar import request_bar
    from autotuner.view.trial import print_trial

    try:
        with command_errors(), request_bar():
            result = asyncio.run(_measure(sc, overrides, logs))
    except FileNotFoundError as exc:  # the command vanished between the preflight and the launch
        raise fail(f"engine.command: {exc.filename or exc}: no such file; set engine.command to the engine's "
                   "full path") from None
    except asyncio.CancelledError:
        typer.echo("interrupted: the engine was stopped", err=True)
        raise typer.Exit(130) from None
    print_trial(result, Console(stderr=as_json))
    if json_out is not None:
        from autotuner.export.atomic import write_text_atomic  # tempfile: start-up time

        write_text_atomic(json_out, json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    if as_json:
        typer.echo(json.dumps(result.to_dict(), default=str))
    raise typer.Exit(0 if result.outcome == "ok" else 1)


async def _measure(sc: Scenario, overrides: dict[str, FlagValue], logs: Path) -> TrialResult:
    """The engine's lifetime in this process (SIGINT, SIGTERM, SIGHUP stop it), or the simulator's
    evaluation in virtual time."""
    import asyncio  # start-up time

    from autotuner.tuner.lifecycle import measure as measure_trial
    from autotuner.tuner.runners import VirtualRunner, runner_for

    backend = backend_for(sc)
    if not backend.runs_process:  # evaluated here, in virtual time
        runner = runner_for(sc, logs)
        assert isinstance(runner, VirtualRunner)
        return runner.evaluate(overrides)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    return await measure_trial(sc, overrides, log_dir=logs, on_phase=lambda p: typer.echo(f"[{p}]", err=True))


def old_json_path(scenario: Path, output: Path | None, as_json: bool, extra: list[str]) -> tuple[Path, Path | None,
                                                                                             bool]:
    """`measure SCENARIO --json PATH` (before 0.2) still writes PATH, with a note: `--json` now prints to
    stdout and `-o/--output PATH` writes a file, as in `vllm bench serve` and `export`."""
    if not extra:
        return scenario, output, as_json
    if not as_json or len(extra) != 1 or output is not None:
        raise UserInputError(f"unexpected argument(s) {' '.join(extra)}: measure takes one scenario file")
    path = Path(extra[0])
    if scenario.suffix == ".json" and path.suffix in (".yaml", ".yml"):  # `--json out.json scenario.yaml`
        scenario, path = path, scenario
    typer.echo(f"note: `--json {path}` is deprecated: use `-o {path}` (a file) or `--json` (stdout)", err=True)
    return scenario, path, False
