"""`engine.env` in the exports: each target quotes names and values by its own rules, so a hostile value
reads back as exactly that value, and a hostile name is refused before anything is rendered (the
scenario refuses it at load too; the exporter does not rely on that)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autotuner.errors import UserInputError
from autotuner.export.certificate import Certificate
from autotuner.export.exporter import run_export
from autotuner.export.formats import RENDERERS, Deployment
from tests.export.conftest import make_study  # noqa: F401  (the fixture)
from tests.support.studies import MakeStudy

HOSTILE_VALUES = [
    "plain",
    "two words",
    "a'b\"c",
    "trailing backslash\\",
    "\\",
    "back\\slash \\n not a newline",
    "$HOME ${HOME} $(id) `id` $$",
    "100%n %% %i",
    "semi; ExecStartPre=/bin/false",
    ";",
    "line\nExecStartPre=/bin/false",
    "cr\r\nKEY=x",
    "unicode \u2028 sep \u0085 é ✓",
    "",
]
HOSTILE_NAMES = ["A;id", "A B", "A\nExecStartPre=/bin/false", "1A", "A=B", "", "A$B", "Ä"]
FLAGS = {"max-num-seqs": 64, "gpu-memory-utilization": 0.8}


def certificate() -> Certificate:
    return Certificate(study="s", trial=1, kind="tpe", policy="knee", slos=[], measured_at="now", metrics={},
                       peak_fraction=None, memory=[], oom_threshold="", engine_version="0.6.0",
                       gpu_inventory=[], model="m", model_fingerprint="f", workload_fingerprint="w", workload="",
                       baseline=None, simulator=None)


def deployment(env: dict[str, str], model: str = "org/model") -> Deployment:
    return Deployment(model=model, served_model_name=None, flags=dict(FLAGS), env=env, secret_env=[],
                      needs_api_key=False, gpu_count=1, gpu_ids=None, engine_version="0.6.0",
                      startup_timeout_s=600, certificate=certificate())


def env_of(values: list[str]) -> dict[str, str]:
    return {f"V{i}": v for i, v in enumerate(values)}


# --- a reader of systemd's quoting (systemd.syntax(7)), to read the unit back ------------------------------

_C = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
      "v": "\v", "s": " "}


def systemd_words(text: str, exec_line: bool) -> list[str]:
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            break
        word, quote = "", None
        while i < n and (quote or text[i] not in " \t"):
            ch = text[i]
            if ch == "\\":
                nxt = text[i + 1]
                if nxt == "x":
                    word += chr(int(text[i + 2:i + 4], 16))
                    i += 4
                elif nxt == "u":
                    word += chr(int(text[i + 2:i + 6], 16))
                    i += 6
                else:
                    word += _C[nxt]
                    i += 2
                continue
            if quote is None and ch in "\"'":
                quote = ch
            elif ch == quote:
                quote = None
            else:
                word += ch
            i += 1
        assert quote is None, f"unbalanced quote in {text!r}"
        word = word.replace("%%", "%")
        words.append(word.replace("$$", "$") if exec_line else word)
    return words


def directives(unit: str) -> list[tuple[str, str]]:
    out = []
    for line in unit.splitlines():
        assert not line.endswith("\\"), f"a line continues onto the next: {line!r}"
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            out.append((line, ""))
            continue
        key, _, value = line.partition("=")
        out.append((key, value))
    return out


RENDERER_WROTE = {"[Unit]", "[Service]", "[Install]", "Description", "After", "Wants", "Type", "Environment",
                  "EnvironmentFile", "ExecStart", "Restart", "RestartSec", "TimeoutStartSec", "KillMode",
                  "TimeoutStopSec", "WantedBy"}


# --- the tests -------------------------------------------------------------------------------------------

def test_cmd_export_reads_back_every_value_through_a_shell_parser() -> None:
    env = env_of(HOSTILE_VALUES)
    text = RENDERERS["cmd"](deployment(env, model="/models/it's $HOME"))
    tokens = shlex.split(text, comments=True)
    start = tokens.index("vllm")
    assignments = dict(t.split("=", 1) for t in tokens[:start])
    assert assignments == env
    assert tokens[start:start + 3] == ["vllm", "serve", "/models/it's $HOME"]


def test_cmd_export_runs_in_a_real_shell_with_exactly_those_values(tmp_path: Path) -> None:
    # The line as a shell runs it, with `vllm` replaced by a program that prints its environment.
    env = env_of(HOSTILE_VALUES)
    text = RENDERERS["cmd"](deployment(env))
    lines = text.split("\n")
    while lines[0].startswith("#"):
        lines.pop(0)
    line = "\n".join(lines)
    head, _, args = line.rpartition(" vllm serve ")
    script = f"{head} env -0 > {shlex.quote(str(tmp_path / 'env'))}; : {args}"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = dict(item.split("=", 1) for item in (tmp_path / "env").read_bytes().decode().split("\0") if "=" in item)
    assert {k: seen.get(k) for k in env} == env
    assert not (tmp_path / "pwned").exists()


def test_yaml_usage_comment_stays_a_comment() -> None:
    text = RENDERERS["yaml"](deployment(env_of(HOSTILE_VALUES)))
    assert yaml.safe_load(text) == FLAGS
    for line in text.splitlines():
        assert line.startswith("#") or re.match(r"[a-z-]+: ", line), line


def test_env_export_reads_back_in_a_shell_and_refuses_line_breaks(tmp_path: Path) -> None:
    one_line = [v for v in HOSTILE_VALUES if not re.search(r"[\n\r\u2028\u0085]", v)]
    env = env_of(one_line)
    path = tmp_path / "vllm.env"
    path.write_text(RENDERERS["env"](deployment(env)))
    out = tmp_path / "seen"
    script = f"set -a; . {shlex.quote(str(path))}; set +a; env -0 > {shlex.quote(str(out))}"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    seen = dict(item.split("=", 1) for item in out.read_bytes().decode().split("\0") if "=" in item)
    assert {k: seen.get(k) for k in env} == env
    for value in ("line\nExecStartPre=/bin/false", "cr\r\nKEY=x", "u\u2028v"):
        with pytest.raises(UserInputError, match=r"^engine\.env\.V0: the value holds a line break"):
            RENDERERS["env"](deployment({"V0": value}))


def test_systemd_unit_reads_back_and_has_only_the_renderers_directives(tmp_path: Path) -> None:
    env = env_of(HOSTILE_VALUES)
    model = "/models/a\\ b\"c$HOME%i;\nExecStartPre=/bin/false"
    unit = RENDERERS["systemd"](deployment(env, model=model))
    found = directives(unit)
    assert {key for key, _ in found} <= RENDERER_WROTE
    assert [key for key, _ in found if key == "ExecStart"] == ["ExecStart"]
    read_env = {}
    for key, value in found:
        if key == "Environment":
            [word] = systemd_words(value, exec_line=False)
            name, _, val = word.partition("=")
            read_env[name] = val
    assert read_env == env
    [exec_start] = [value for key, value in found if key == "ExecStart"]
    argv = systemd_words(exec_start, exec_line=True)
    assert argv[:4] == ["/usr/bin/env", "vllm", "serve", model]
    if shutil.which("systemd-analyze"):
        path = tmp_path / "vllm.service"
        path.write_text(unit)
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                              timeout=60)
        problems = [line for line in done.stderr.splitlines() if str(path) in line and "vllm.env" not in line]
        assert not problems, done.stderr


@pytest.mark.parametrize("fmt", ["cmd", "env", "systemd", "yaml"])
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_name_that_is_not_a_posix_name_is_refused(fmt: str, name: str) -> None:
    with pytest.raises(UserInputError, match=r"^engine\.env: .* is not a valid variable name"):
        RENDERERS[fmt](deployment({name: "x"}))


@pytest.mark.parametrize("key", ["model", "served_model_name"])
def test_a_model_that_reads_as_an_option_is_refused_by_the_exporter(make_study: MakeStudy, key: str) -> None:  # noqa: F811
    try:
        study = make_study(engine={key: "--trust-remote-code"})
    except Exception:  # the scenario refuses it at load already: nothing to export
        return
    with pytest.raises(UserInputError, match=rf"^engine\.{key}: '--trust-remote-code' starts with '-'"):
        run_export(study.storage, None, [], "max-throughput", "cmd", None, force=True, allow_unverified=True)


def test_compose_environment_reads_back_through_the_yaml_loader() -> None:
    env = env_of(HOSTILE_VALUES)
    text = RENDERERS["compose"](deployment(env, model="/models/$HOME x\nevil: 1"))
    data = yaml.safe_load(text)
    assert set(data) == {"services"} and set(data["services"]) == {"vllm"}
    service = data["services"]["vllm"]
    # Compose interpolates `$` in every string: each literal one is doubled, and nothing else changes.
    got = {k: v.replace("$$", "$") for k, v in service["environment"].items() if k in env}
    assert got == env
    assert service["command"][0] == "/models/$$HOME x\nevil: 1"
