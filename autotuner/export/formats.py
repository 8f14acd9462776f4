"""The chosen configuration as something to deploy: a command line, a `vllm serve --config` file, a
docker compose service, a systemd unit, an env file, or JSON. Each carries the certificate.

What is exported: the model, the served model name the scenario fixed, the scenario's fixed flags and
the trial's searched ones (both are in the trial's flags), and the scenario's environment minus
secrets. Never exported: the tuner's --host/--port (the deployment binds where it wants) and any API
key — vLLM reads VLLM_API_KEY from its environment, so the key stays out of files, `ps` and history.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import yaml

from autotuner.analysis.selection import Selection
from autotuner.engine.launch import API_KEY_VAR
from autotuner.env_references import variables
from autotuner.errors import UserInputError
from autotuner.export.certificate import Certificate
from autotuner.scenario import RESERVED_FLAGS
from autotuner.secrets import is_secret_name
from autotuner.vllm import FlagValue, flag_argv

Format = Literal["cmd", "yaml", "compose", "systemd", "env", "json", "helm-values", "kserve", "k8s-args", "ray-serve"]
FORMATS: tuple[str, ...] = get_args(Format)
IMAGE = "vllm/vllm-openai"
PORT = 8000
_PLAIN_ENV_VALUE = re.compile(r"^[\w@%+=:,./-]*$")
# What a shell, systemd and compose all accept as a variable's name; the scenario checks it at load, the
# renderers again (a name is written unquoted: `NAME=value`, `Environment="NAME=..."`).
POSIX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Line breaks and other control characters: an env file is read line by line (a shell's `.`, systemd's
# EnvironmentFile=, compose's env_file:), and each reader treats a break inside quotes its own way.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def is_secret(name: str) -> bool:
    """Same rule as the launcher's redaction: such variables never reach an exported file."""
    return is_secret_name(name)


def from_environment(name: str, value: str) -> bool:
    """A variable the deployment supplies itself: a secret, or a value the scenario took from the
    tuner's environment (`${VAR}`), which the study stored by name only."""
    return is_secret(name) or bool(variables(value))


@dataclass
class Deployment:
    model: str
    served_model_name: str | None
    flags: dict[str, FlagValue]
    env: dict[str, str]  # non-secret variables, with values
    secret_env: list[str]  # names only: the deployment supplies them
    needs_api_key: bool  # the study ran with an API key, so clients expect one
    gpu_count: int
    gpu_ids: list[int] | None
    engine_version: str
    startup_timeout_s: float
    certificate: Certificate
    notes: list[str] = field(default_factory=list)

    def serve_args(self) -> list[str]:
        """What follows `vllm serve`: the model, then the options."""
        named = ["--served-model-name", self.served_model_name] if self.served_model_name else []
        return [self.model, *named, *flag_argv(self.flags)]

    def argv(self) -> list[str]:
        return ["vllm", "serve", *self.serve_args()]

    def run_env(self) -> dict[str, str]:
        """The environment the command needs, GPU pinning included (NVML order, as the tuner used)."""
        env = dict(self.env)
        if self.gpu_ids is not None:
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpu_ids))
        return env


def check_env_names(names: list[str] | Mapping[str, str]) -> None:
    """Refuse to render a variable name that is not a POSIX name: written unquoted, `A;rm -rf ~` would run
    in the `cmd` export and a name with a newline would add a directive to the systemd unit."""
    for name in names:
        if not POSIX_NAME.fullmatch(name):
            shown = name if len(name) <= 60 else name[:60] + "…"
            raise UserInputError(f"engine.env: {shown!r} is not a valid variable name (letters, digits and _, "
                                 "not starting with a digit); rename it in the scenario")


def check_not_an_option(key: str, value: str | None) -> None:
    """`vllm serve --evil` would read a model name as an option in every exported command line."""
    if value is not None and value.startswith("-"):
        raise UserInputError(f"{key}: {value[:60]!r} starts with '-', so vLLM would read it as an option; "
                             "give the model's name or path (e.g. ./-model for a directory named so)")


def deployment(selection: Selection, certificate: Certificate) -> Deployment:
    study = selection.study
    engine = study.scenario.engine
    check_env_names(engine.env)
    check_not_an_option("engine.model", engine.model)
    check_not_an_option("engine.served_model_name", engine.served_model_name)
    flags = {k: v for k, v in selection.chosen.flags.items() if k not in RESERVED_FLAGS}
    env = {k: v for k, v in engine.env.items() if not from_environment(k, v) and k != API_KEY_VAR}
    secrets = sorted({k for k, v in engine.env.items() if from_environment(k, v)} - {API_KEY_VAR})
    return Deployment(model=engine.model, served_model_name=engine.served_model_name, flags=flags, env=env,
                      secret_env=secrets, needs_api_key=engine.api_key_env is not None,
                      gpu_count=len(study.record.key.gpu_inventory) or 1, gpu_ids=engine.gpus,
                      engine_version=study.record.key.engine_version, startup_timeout_s=engine.startup_timeout_s,
                      certificate=certificate)


# --- shared pieces -----------------------------------------------------------------------------------

def one_line(text: str) -> str:
    """Every kind of line break (\\r, \\n, U+2028, ...) folded into a space: embedded text such as an
    engine's multi-line failure reason can never start a line of its own in a file."""
    return " ".join(text.splitlines())


def _comment(lines: list[str]) -> str:
    """Comment lines; an embedded line break continues the comment instead of ending it."""
    out = []
    for line in lines:
        parts = line.splitlines() or [""]
        out += [f"# {part}\n" if part else "#\n" for part in parts]
    return "".join(out)


def _header(d: Deployment, extra: list[str]) -> str:
    return _comment([*d.certificate.lines(), "", *extra, *_secret_notes(d)])


def _secret_notes(d: Deployment) -> list[str]:
    notes = []
    if d.needs_api_key:
        notes.append(f"API key: the study served with one; set {API_KEY_VAR} in the deployment's environment "
                     "(vLLM reads it there; never put --api-key on a command line)")
    if d.secret_env:
        notes.append(f"secrets and ${{VAR}} values left out, supply them from the environment: "
                     f"{', '.join(d.secret_env)}")
    return notes


def _image(version: str) -> str:
    match = re.match(r"\d+\.\d+\.\d+", version)
    return f"{IMAGE}:v{match.group(0)}" if match else f"{IMAGE}:latest"


# --- the formats -------------------------------------------------------------------------------------

def _shell_assignments(d: Deployment) -> list[str]:
    env = d.run_env()
    check_env_names(env)
    return [f"{k}={shlex.quote(v)}" for k, v in env.items()]


def render_cmd(d: Deployment) -> str:
    assignments = _shell_assignments(d)
    return _header(d, ["run:"]) + " ".join([*assignments, shlex.join(d.argv())]) + "\n"


def render_yaml(d: Deployment) -> str:
    """For `vllm serve MODEL --config FILE`: long option names as keys; true → --x, false → --no-x."""
    body: dict[str, Any] = {}
    if d.served_model_name:
        body["served-model-name"] = d.served_model_name
    body.update(d.flags)
    env = " ".join(_shell_assignments(d))
    usage = [f"run: {env + ' ' if env else ''}vllm serve {shlex.quote(d.model)} --config THIS_FILE",
             "(the model is the command's positional argument, not a key of this file)"]
    return _header(d, usage) + config_yaml_body(body)


def config_yaml_body(body: Mapping[str, Any]) -> str:
    """The keys of a `vllm serve --config` file, as every writer of one renders them (export, deploy)."""
    return yaml.safe_dump(dict(body), sort_keys=False, default_flow_style=False, allow_unicode=True)


def _compose_escape(value: str) -> str:
    # Compose interpolates $VAR in every string of the file: a literal $ must be doubled.
    return value.replace("$", "$$")


def render_compose(d: Deployment) -> str:
    env: dict[str, str] = {k: _compose_escape(v) for k, v in d.env.items()}
    if d.needs_api_key:
        env[API_KEY_VAR] = f"${{{API_KEY_VAR}:?set {API_KEY_VAR}, the key clients must send}}"
    else:
        env[API_KEY_VAR] = f"${{{API_KEY_VAR}:-}}"  # empty: no authentication, as in the study
    for name in d.secret_env:
        env[name] = f"${{{name}}}"
    device: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
    if d.gpu_ids is not None:
        device["device_ids"] = [str(i) for i in d.gpu_ids]
    else:
        device["count"] = d.gpu_count
    volumes = ["${HOME}/.cache/huggingface:/root/.cache/huggingface"]
    if d.model.startswith("/"):
        volumes.append(f"{_compose_escape(d.model)}:{_compose_escape(d.model)}:ro")
    service: dict[str, Any] = {
        "image": _image(d.engine_version),
        "command": [_compose_escape(a) for a in d.serve_args()],
        "environment": env,
        "ports": [f"{PORT}:{PORT}"],
        "ipc": "host",  # tensor-parallel workers share memory through /dev/shm
        "volumes": volumes,
        "deploy": {"resources": {"reservations": {"devices": [device]}}},
        "healthcheck": {
            "test": ["CMD", "python3", "-c",
                     f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{PORT}/health', timeout=5)"],
            "interval": "10s", "timeout": "6s", "retries": 3, "start_period": f"{int(d.startup_timeout_s)}s",
        },
        "restart": "on-failure",
        "stop_grace_period": "30s",
    }
    usage = ["run: docker compose -f THIS_FILE up -d",
             "the image's entrypoint is `vllm serve`; the command holds the model and the tuned flags"]
    if d.engine_version.startswith("unknown"):
        usage.append("the study did not record vLLM's version: pin the image tag to the one you tuned with")
    return _header(d, usage) + yaml.safe_dump({"services": {"vllm": service}}, sort_keys=False,
                                              default_flow_style=False, allow_unicode=True, width=1000)


def systemd_escape(value: str) -> str:
    """Text in a systemd setting, outside quotes (Description=): `%` doubled (specifiers expand
    everywhere) and control characters written as C escapes, so a line break never ends the setting."""
    return _systemd_controls(value.replace("%", "%%"))


def _systemd_controls(value: str) -> str:
    return _CONTROL.sub(lambda m: _C_ESCAPES.get(m[0], f"\\x{ord(m[0]):02x}")
                        if ord(m[0]) < 0x80 else f"\\u{ord(m[0]):04x}", value)


_C_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def systemd_quote(word: str, exec_line: bool) -> str:
    """One word of a systemd setting, double-quoted by systemd.syntax(7)'s rules: inside quotes systemd
    decodes C escapes (so `\\` and `"` are escaped, and control characters written as escapes: a line
    break never ends the setting) and expands `%` specifiers (`%%`). Only command lines (ExecStart=)
    expand `$VAR` too (`$$`); in Environment= a `$` is literal and must stay single."""
    word = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_line:
        word = word.replace("$", "$$")
    return f'"{_systemd_controls(word)}"'


def systemd_command(argv: list[str]) -> str:
    """An ExecStart= value: each word as it is when plain, else quoted on its own — a quoted `;` is an
    argument, never a command separator; a quoted `\\` never escapes the line's end."""
    return " ".join(word if _PLAIN_WORD.fullmatch(word) else systemd_quote(word, exec_line=True) for word in argv)


# A word systemd takes as it is: no quote, backslash, specifier, variable, separator or space in it.
_PLAIN_WORD = re.compile(r"[\w@+=:,./-]+")


def _unit_comment(lines: list[str]) -> str:
    # A line ending in a backslash continues on the next one in a unit file: no comment may end so.
    return "".join(line.rstrip("\\") + "\n" for line in lines)


def render_systemd(d: Deployment) -> str:
    name = d.served_model_name or d.model
    lines = [
        "[Unit]",
        "Description=" + systemd_escape(one_line(f"vLLM serving {name} (autotuner study {d.certificate.study}, "
                                                 f"trial {d.certificate.trial})")),
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    env = d.run_env()
    check_env_names(env)
    check_env_names(d.secret_env)
    lines += [f"Environment={systemd_quote(f'{key}={value}', exec_line=False)}" for key, value in env.items()]
    lines += [
        f"# Secrets ({', '.join([API_KEY_VAR, *d.secret_env])}) go in this root-only file, never in the unit:",
        "EnvironmentFile=-/etc/vllm/vllm.env",
        "# vllm must be on systemd's PATH; for a virtualenv, write its absolute path instead of /usr/bin/env vllm.",
        "ExecStart=" + systemd_command(["/usr/bin/env", *d.argv()]),
        "Restart=on-failure",
        "RestartSec=10",
        f"TimeoutStartSec={int(d.startup_timeout_s)}",
        "# SIGTERM to the whole control group: vLLM's engine core and workers hold GPU memory.",
        "KillMode=control-group",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    header = _header(d, ["install: copy to /etc/systemd/system/vllm.service, then systemctl daemon-reload && "
                         "systemctl enable --now vllm"])
    return _unit_comment(header.splitlines()) + "\n".join(lines) + "\n"


def env_name(flag: str) -> str:
    return "AUTOTUNER_FLAG_" + re.sub(r"[^A-Za-z0-9]", "_", flag).upper()


def _env_value(value: str) -> str:
    """Unquoted when plain; else double-quoted with the characters shells and systemd treat specially
    escaped."""
    return value if _PLAIN_ENV_VALUE.match(value) else _quoted(value)


def _quoted(value: str) -> str:
    return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'


def _flag_text(value: FlagValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def _env_file_assignments(d: Deployment) -> list[str]:
    """`NAME=value` lines, each value quoted for a POSIX shell (what `set -a; . FILE` reads; systemd's
    EnvironmentFile= and compose read the same quotes). A line break has no one meaning across those
    readers, so a value with one is refused rather than guessed."""
    env = d.run_env()
    check_env_names(env)
    for name, value in env.items():
        if _CONTROL.search(value):
            raise UserInputError(f"engine.env.{name}: the value holds a line break or control character, which an "
                                 "env file cannot carry on one line; remove it, or export --format cmd or systemd")
    return [f"{k}={shlex.quote(v)}" for k, v in env.items()]


def render_env(d: Deployment) -> str:
    named = ["--served-model-name", d.served_model_name] if d.served_model_name else []
    lines = [f"VLLM_MODEL={_env_value(d.model)}",
             f"VLLM_ARGS={_quoted(shlex.join([*named, *flag_argv(d.flags)]))}"]
    lines += [f"{env_name(k)}={_env_value(_flag_text(v))}" for k, v in d.flags.items()]
    lines += _env_file_assignments(d)
    usage = ['use: set -a; . THIS_FILE; set +a; vllm serve "$VLLM_MODEL" $VLLM_ARGS',
             "or EnvironmentFile= in a systemd unit / env_file: in compose"]
    return _header(d, usage) + "\n".join(lines) + "\n"


def render_json(d: Deployment) -> str:
    payload = {
        "model": d.model,
        "served_model_name": d.served_model_name,
        "flags": d.flags,
        "argv": d.argv(),
        "env": d.run_env(),
        "secret_env": d.secret_env,
        "api_key_env": API_KEY_VAR if d.needs_api_key else None,
        "certificate": d.certificate.to_dict(),
    }
    return json.dumps(payload, indent=2, default=str) + "\n"


RENDERERS: dict[str, Callable[[Deployment], str]] = {
    "cmd": render_cmd, "yaml": render_yaml, "compose": render_compose, "systemd": render_systemd,
    "env": render_env, "json": render_json,
}


def _cluster(fmt: str) -> Callable[[Deployment], str]:
    """The cluster platforms' formats (export/cluster.py) build on this module's Deployment, so they are
    looked up when rendered: either module can then be imported first."""
    def render(d: Deployment) -> str:
        from autotuner.export.cluster import CLUSTER_RENDERERS
        return CLUSTER_RENDERERS[fmt](d)
    return render


RENDERERS.update({fmt: _cluster(fmt) for fmt in ("helm-values", "kserve", "k8s-args", "ray-serve")})
