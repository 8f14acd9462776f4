"""Does the engine command exist and run, and is its vLLM version one we know?"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from autotuner.backends import backend_for
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import KNOWN, SIMULATED_VERSION, is_known
from autotuner.vllm.versions import VERSION_TIMEOUT_S, probe_version, version_argv

_FIX_COMMAND = ("install vLLM where this command can find it, or set engine.command to its full path, e.g. "
                "[/path/to/venv/bin/vllm, serve] or [/path/to/venv/bin/python, -m, "
                "vllm.entrypoints.openai.api_server, --model]")


def resolve_command(program: str, env: dict[str, str]) -> str | None:
    """The executable `program` names, as the engine's Popen would find it (PATH of its environment)."""
    if os.sep in program:
        path = Path(program).expanduser()
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


def check_engine(scenario: Scenario) -> tuple[list[Check], str | None]:
    """The command check, the version check, and the version found (None when unknown)."""
    engine = scenario.engine
    if backend_for(engine).simulated and engine.command is None:
        return [Check("engine command", "ok", "the built-in simulator"),
                Check("vLLM version", "ok", f"{SIMULATED_VERSION} (simulated)")], SIMULATED_VERSION
    prefix = engine.command_prefix()
    env = {**os.environ, **engine.resolved_env()}
    found = resolve_command(prefix[0], env)
    if found is None:
        where = "is not an executable file" if os.sep in prefix[0] else "is not found on PATH"
        return [Check("engine command", "failed", f"engine.command: `{prefix[0]}` {where}", _FIX_COMMAND)], None
    probe = probe_version(prefix, env)
    argv = version_argv([found, *prefix[1:]])
    if probe.timed_out:
        return [Check("engine command", "warning", f"`{' '.join(argv[:2])}` did not answer within "
                      f"{VERSION_TIMEOUT_S:g} s", "check that the engine's installation works")], None
    if probe.start_error is not None:
        return [Check("engine command", "failed", f"engine.command: `{found}` cannot run: {probe.start_error}",
                      _FIX_COMMAND)], None
    if probe.answer is None:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [Check("engine command", "warning", f"`{found} --version` exited {probe.returncode}: {last}",
                      "run the command by hand: a broken installation fails every trial")], None
    version = probe.answer.split()[-1]
    checks = [Check("engine command", "ok", found)]
    if is_known(version):
        checks.append(Check("vLLM version", "ok", version))
    else:
        checks.append(Check("vLLM version", "warning", f"{version} is not a version autotuner knows "
                            f"({', '.join(KNOWN)}): its flag rules and log lines may differ",
                            "use a known vLLM version, or expect flag checks to be vLLM's own"))
    return checks, version
