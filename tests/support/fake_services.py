"""Fake `systemctl` and `docker` executables for the deploy tests: real programs that record their argv
(one JSON list a line) and keep a service's state in a file, so the targets run them exactly as they would
run the real ones; a service refuses a config holding REFUSED_KEY, as vLLM refuses an unknown option."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The "service" refuses a config holding this key, as vLLM refuses an option it does not know.
REFUSED_KEY = "no-such-option"

_COMMON = '''
import json, sys
from pathlib import Path
import yaml
calls, state, config = Path({calls!r}), Path({state!r}), Path({config!r})
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")

def run(name):
    data = yaml.safe_load(config.read_text()) if config.exists() else {{}}
    if {refused!r} in (data or {{}}):
        state.write_text("failed")
        sys.stderr.write("vllm: error: unrecognized arguments: --{refused}\\n")
        sys.exit(1)
    state.write_text("active " + json.dumps(data))
'''

_SYSTEMCTL = _COMMON + '''
args = [a for a in sys.argv[1:] if a != "--quiet"]
verb = args[0]
if verb == "daemon-reload":
    sys.exit(0)
unit = args[1]
if unit != {unit!r}:
    sys.stderr.write(f"Unit {{unit}} not found.\\n")
    sys.exit(5)
if verb in ("restart", "start"):
    try:
        run(unit)
    except SystemExit as e:
        sys.stderr.write(f"Job for {{unit}} failed because the control process exited with error code.\\n")
        raise
elif verb == "stop":
    state.write_text("inactive")
elif verb == "is-active":
    now = state.read_text().split()[0] if state.exists() else "inactive"
    print(now)
    sys.exit(0 if now == "active" else 3)
'''

_DOCKER = _COMMON + '''
args = sys.argv[1:]
assert args[0] == "compose" and args[1] == "-f", args
args = args[3:]
if args[0] == "-p":
    args = args[2:]
verb, service = args[0], args[-1]
if service != {service!r}:
    sys.stderr.write(f"no such service: {{service}}\\n")
    sys.exit(1)
if verb == "up":
    run(service)
elif verb == "stop":
    state.write_text("inactive")
elif verb == "ps":
    if state.exists() and state.read_text().startswith("active"):
        print("3f2a9c1d0b7e")
'''


def _install(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(0o755)
    return path


class FakeService:
    def __init__(self, directory: Path, config: Path) -> None:
        self.calls_path = directory / "calls.jsonl"
        self.state_path = directory / "state"
        self.config = config
        self._dir = directory

    def _fields(self) -> dict[str, str]:
        return {"calls": str(self.calls_path), "state": str(self.state_path), "config": str(self.config),
                "refused": REFUSED_KEY}

    def systemctl(self, unit: str) -> Path:
        return _install(self._dir / "systemctl", _SYSTEMCTL.format(unit=unit, **self._fields()))

    def docker(self, service: str) -> Path:
        return _install(self._dir / "docker", _DOCKER.format(service=service, **self._fields()))

    def calls(self) -> list[list[str]]:
        if not self.calls_path.exists():
            return []
        return [json.loads(line) for line in self.calls_path.read_text().splitlines()]

    def state(self) -> str:
        return self.state_path.read_text() if self.state_path.exists() else "inactive"

    def serving(self) -> dict[str, object] | None:
        """The flags the service runs with, or None when it does not run."""
        text = self.state()
        return json.loads(text.split(" ", 1)[1]) if text.startswith("active ") else None
