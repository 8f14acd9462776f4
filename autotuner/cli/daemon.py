"""`autotuner daemon run` and `autotuner daemon status`: the daemon in the foreground, and what it is
doing and has done, read from its database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import LOG_FORMAT_HELP, configure_logging, log_to_file
from autotuner.errors import UserInputError

if TYPE_CHECKING:
    from autotuner.daemon.config import LoadedConfig
    from autotuner.store.db import Store

RUN_EPILOG = ("Signals: SIGTERM finishes or rolls back the step in flight, then exits 0; SIGHUP reloads CONFIG. "
              "Exit status: 0 stopped cleanly (--dry-run: a cycle can complete); 2 bad CONFIG, nothing started "
              "(--dry-run: a cycle cannot complete, and why).")


def daemon_run(
    config: Path = typer.Argument(..., help="daemon config YAML (see the README's daemon section)"),
    log_format: str = typer.Option("json", "--log-format", help=LOG_FORMAT_HELP),
    once: bool = typer.Option(False, "--once", help="run one cycle (the trigger that fires, else a manual one) "
                              "to its end or until it waits for its window or an approval, then exit"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what a cycle would do and why; change nothing"),
) -> None:
    """Run the daemon in the foreground (as a systemd or compose service)."""
    import asyncio  # start-up time, as the imports below

    if dry_run:
        _print_plan(config)
        return
    from autotuner.daemon.loop import Daemon

    configure_logging(log_format)
    with command_errors():
        daemon = Daemon(config)
    log_to_file(f"{daemon.states.deployment}-daemon", True)
    with command_errors():
        code = asyncio.run(daemon.run(once=once))
    raise typer.Exit(code)


def daemon_plan(config: Path = typer.Argument(..., help="daemon config YAML")) -> None:
    """What a cycle would do and why, changing nothing (the same as `daemon run --once --dry-run`)."""
    _print_plan(config)


def _print_plan(config: Path) -> None:
    from autotuner.daemon.plan import plan_cycle

    with command_errors():
        plan = plan_cycle(config)
        for line in plan.lines:
            typer.echo(line)
        if not plan.can_complete:
            raise UserInputError("a cycle cannot complete with this config: " + "; ".join(plan.problems))
    typer.echo("a cycle can complete with this config")


def _decide(config: Path, cycle_id: int, verdict: str, who: str) -> None:
    from autotuner.daemon.config import load_config
    from autotuner.daemon.state import PROPOSED, CycleStore

    with command_errors():
        loaded = load_config(config)
        states = CycleStore(_daemon_store(loaded), loaded.scenario.name)
        cycle = states.cycle(cycle_id)
        if cycle is None or cycle.deployment != states.deployment:
            raise UserInputError(f"cycle {cycle_id}: no such cycle of deployment {states.deployment}; `autotuner "
                                 f"daemon status {config}` lists them")
        if cycle.state != PROPOSED:
            raise UserInputError(f"cycle {cycle_id} is {cycle.state}"
                                 + (f" ({cycle.outcome})" if cycle.outcome else "")
                                 + ", not proposed: only a proposed cycle can be approved or rejected")
        if states.decision(cycle_id) is not None:
            raise UserInputError(f"cycle {cycle_id} was already decided: {states.decision(cycle_id)}")
        states.decide(cycle_id, verdict, who)
    typer.echo(f"cycle {cycle_id}: {verdict.rstrip('e')}ed; the daemon acts on it at its next poll")


def daemon_approve(config: Path = typer.Argument(..., help="daemon config YAML"),
                   cycle: int = typer.Argument(..., help="the proposed cycle's number (daemon status)"),
                   by: str = typer.Option(None, "--by", help="who decides (default: $USER)")) -> None:
    """Deploy a proposed cycle's winner (`approve: manual`)."""
    import getpass

    _decide(config, cycle, "approve", by or getpass.getuser())


def daemon_reject(config: Path = typer.Argument(..., help="daemon config YAML"),
                  cycle: int = typer.Argument(..., help="the proposed cycle's number (daemon status)"),
                  by: str = typer.Option(None, "--by", help="who decides (default: $USER)")) -> None:
    """Refuse a proposed cycle's winner: it is never proposed again for this box and workload."""
    import getpass

    _decide(config, cycle, "reject", by or getpass.getuser())


def daemon_status(
    config: Path = typer.Argument(..., help="daemon config YAML"),
    as_json: bool = typer.Option(False, "--json", help="print what GET /status answers, as JSON"),
) -> None:
    """What the daemon is doing and has done, read from its database (the same facts as GET /status), whether
    the daemon process is alive, and what production really runs (its live file, /v1/models and /version)."""
    import asyncio

    from autotuner.daemon.config import load_config  # start-up time, as the imports below
    from autotuner.daemon.refusals import Refusals
    from autotuner.daemon.runtime import RuntimeStore
    from autotuner.daemon.state import CycleStore
    from autotuner.daemon.status import status_document, status_lines
    from autotuner.deploy import make_target
    from autotuner.watch.probe import probe

    with command_errors():
        loaded = load_config(config)
        store = _daemon_store(loaded)
        states = CycleStore(store, loaded.scenario.name)
        p = loaded.config.production
        snap = asyncio.run(probe(p.endpoint, api_key_env=p.api_key_env, timeout_s=3.0))
        doc = status_document(states, loaded.config, target=make_target(loaded.config.deploy),
                              runtime_store=RuntimeStore(store, states.deployment),
                              refusals=Refusals(store, states.deployment), snapshot=snap)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        for line in status_lines(doc):
            typer.echo(line)


def _daemon_store(loaded: LoadedConfig) -> Store:
    from autotuner.store.db import Store, sqlalchemy_url  # SQLAlchemy: start-up time

    url = sqlalchemy_url(loaded.storage_url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserInputError(f"storage {url.removeprefix('sqlite:///')}: no database yet — has `autotuner daemon "
                             "run` started with this config?")
    return Store(url)
