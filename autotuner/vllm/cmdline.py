"""A `vllm serve` command line as vLLM 0.32 parses it: the model, the engine flags (typed, from the
flag table) and the API server's own options.

The one argparse description of that command line (`add_serve_arguments`) and the one `--config`
reader (`read_config_file`): `parse_serve_command` (init --from-cmd) and the simulator's parser
(sim/args.py, which adds its `--sim-*` options) are both built from them.

Accepts `vllm serve MODEL [flags]` and `python -m vllm.entrypoints.openai.api_server --model MODEL
[flags]`, with leading `NAME=value` environment assignments. Like vLLM's FlexibleArgumentParser,
`--max_model_len` is `--max-model-len` and `--flag=value` is `--flag value`.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autotuner.errors import AutotunerError, UserInputError
from autotuner.secrets import is_secret_name
from autotuner.vllm.flags import FlagSpec, FlagValue, flag_argv, flag_name
from autotuner.vllm.versions import VllmKnowledge, knowledge_for

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVE_COMMAND = ("vllm", "serve")  # vLLM's console script and its server subcommand
# Short options vLLM defines for engine flags (vllm/engine/arg_utils.py).
SHORT_ALIASES: Mapping[str, str] = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
                                    "-dp": "data-parallel-size", "-q": "quantization"}
# The API server's options that are not engine flags (vllm/entrypoints/openai/cli_args.py), besides
# host, port, api-key, served-model-name and config, which the tuner sets itself.
SERVER_FLAGS: Mapping[str, FlagSpec] = {s.name: s for s in (
    FlagSpec("chat-template", "str"), FlagSpec("response-role", "str"), FlagSpec("root-path", "str"),
    FlagSpec("tool-call-parser", "str"), FlagSpec("enable-auto-tool-choice", "bool"),
    FlagSpec("reasoning-parser", "str"), FlagSpec("tokenizer-mode", "str"), FlagSpec("max-log-len", "int"),
    FlagSpec("disable-uvicorn-access-log", "bool"), FlagSpec("enable-log-requests", "bool"),
    FlagSpec("allowed-origins", "list"), FlagSpec("ssl-keyfile", "str"), FlagSpec("ssl-certfile", "str"),
)}
# Options whose value is a secret: never copied anywhere; the variable vLLM also reads is named instead.
SECRET_FLAGS: Mapping[str, str] = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}


class CommandLineError(UserInputError):
    """A command line that is not a `vllm serve` we can read (exit 2)."""


@dataclass(frozen=True)
class ServeCommand:
    command: list[str]  # argv before the model: ["vllm", "serve"] or [python, -m, module, --model]
    model: str
    flags: dict[str, FlagValue]  # engine and passthrough server flags, typed, long names
    served_model_names: list[str] = field(default_factory=list)
    host: str | None = None
    port: int | None = None
    config_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # NAME=value before the command, secrets left out
    secrets_dropped: list[str] = field(default_factory=list)  # "--api-key", "HF_TOKEN=" ...: not copied
    api_key_given: bool = False


def split_command(text: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CommandLineError(f"--from-cmd: cannot split the command line ({exc}); quote it as the shell "
                               "would") from None
    if not argv:
        raise CommandLineError("--from-cmd is empty: pass the command that starts vLLM, e.g. "
                               "'vllm serve MODEL --tensor-parallel-size 8'")
    return argv


def parse_serve_command(argv: Sequence[str], version: str | None = None) -> ServeCommand:
    """Raises CommandLineError naming the token that is wrong and what would be right."""
    knowledge = knowledge_for(version)
    tokens = list(argv)
    env: dict[str, str] = {}
    dropped: list[str] = []
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-") and tokens[0].split("=")[0].isidentifier():
        name, _, value = tokens.pop(0).partition("=")
        if is_secret_name(name):
            dropped.append(f"{name}=")
        else:
            env[name] = value
    prefix, rest = _prefix(tokens)
    parser = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    add_serve_arguments(parser, knowledge)
    ns, unknown = parser.parse_known_args(normalise_options(rest))
    if unknown:
        raise CommandLineError(_unknown_message(unknown, knowledge))
    model = ns.model_tag or ns.model_flag
    if not model:
        raise CommandLineError("--from-cmd: no model: `vllm serve MODEL ...` (or `--model MODEL`) names it")
    raw: dict[str, object] = {}
    config_file = ns.config
    if config_file:
        raw.update(_config_file(config_file))
    raw.update(given_flags(ns, knowledge))
    flags: dict[str, FlagValue] = {}
    for name, value in raw.items():
        spec = knowledge.spec(name) or SERVER_FLAGS.get(name)
        flags[name] = spec.coerce(value, f"--from-cmd --{name}") if spec else value  # type: ignore[assignment]
    api_key_given = ns.api_key is not None or "api-key" in raw
    for secret in SECRET_FLAGS:
        if getattr(ns, flag_dest(secret), None) is not None or secret in raw:
            dropped.append(f"--{secret}")
            flags.pop(secret, None)
    served = ns.served_model_name or []
    return ServeCommand(command=prefix, model=str(model), flags=flags, served_model_names=list(served),
                        host=ns.host, port=ns.port, config_file=config_file, env=env, secrets_dropped=dropped,
                        api_key_given=api_key_given)


def _prefix(tokens: list[str]) -> tuple[list[str], list[str]]:
    if len(tokens) >= 2 and (Path(tokens[0]).name, tokens[1]) == SERVE_COMMAND:
        return tokens[:2], tokens[2:]
    if "-m" in tokens:
        i = tokens.index("-m")
        if i + 1 < len(tokens) and tokens[i + 1] == API_SERVER_MODULE and Path(tokens[0]).name.startswith("python"):
            return [*tokens[: i + 2], "--model"], tokens[i + 2:]
    shown = " ".join(tokens[:3])
    raise CommandLineError(f"--from-cmd: {shown!r}... is not a vLLM server command: expected `vllm serve MODEL "
                           f"[flags]` or `python -m {API_SERVER_MODULE} --model MODEL [flags]`")


def flag_dest(name: str) -> str:
    """The argparse attribute of a long option: `max-num-seqs` → `max_num_seqs`."""
    return name.replace("-", "_")


def normalise_options(argv: Sequence[str]) -> list[str]:
    """vLLM's spelling rule on a command line: `--max_model_len=8k` → `--max-model-len=8k`."""
    out = []
    for token in argv:
        name, eq, value = token.partition("=")
        out.append("--" + flag_name(name) + eq + value if token.startswith("--") else token)
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandLineError(f"--from-cmd: {message}")


def add_serve_arguments(parser: argparse.ArgumentParser, knowledge: VllmKnowledge, *, typed: bool = False,
                        shown: Callable[[str], bool] | None = None,
                        model_help: str = "the model: a hub name or a directory with config.json") -> None:
    """`vllm serve`'s arguments on `parser`: MODEL (or --model), --config, the server's own options and
    every flag of the table. `typed`: values parsed by argparse with vLLM's types and choices (an
    unparsable value exits 2 there, as in vLLM); else kept as given, for `FlagSpec.coerce` to type
    afterwards with an error naming the flag. `shown(name)`: the options `--help` lists (all by default).
    No defaults are set: what was not given stays None (vLLM's defaults depend on the platform)."""
    parser.add_argument("model_tag", nargs="?", help=model_help)
    parser.add_argument("--model", dest="model_flag", help="same as the positional MODEL")
    parser.add_argument("--config", help="YAML file of long option names; the command line wins")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--served-model-name", nargs="+")
    for secret in SECRET_FLAGS:
        parser.add_argument(f"--{secret}", help=None if shown is None or shown(secret) else argparse.SUPPRESS)
    aliases = {v: k for k, v in SHORT_ALIASES.items()}
    for spec in [*knowledge.flags.values(), *SERVER_FLAGS.values()]:
        names = [f"--{spec.name}", *([aliases[spec.name]] if spec.name in aliases else [])]
        text = spec.help if shown is None or shown(spec.name) else argparse.SUPPRESS
        dest = flag_dest(spec.name)
        if spec.kind == "bool":
            parser.add_argument(*names, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif spec.kind == "list":
            parser.add_argument(*names, dest=dest, nargs="+", help=text)
        elif typed:
            parser.add_argument(*names, dest=dest, type=spec.parser, choices=spec.choices, help=text)
        else:
            parser.add_argument(*names, dest=dest, help=text)


def given_flags(ns: argparse.Namespace, knowledge: VllmKnowledge) -> dict[str, object]:
    """The engine and server flags a parsed command line gave, by long name (unset ones left out)."""
    out: dict[str, object] = {}
    for name in [*knowledge.flags, *SERVER_FLAGS]:
        value = getattr(ns, flag_dest(name), None)
        if value is not None:
            out[name] = value
    return out


def _unknown_message(unknown: list[str], knowledge: VllmKnowledge) -> str:
    first = next((t for t in unknown if t.startswith("-")), unknown[0])
    if not first.startswith("-"):
        return f"--from-cmd: unexpected argument {first!r}: vllm serve takes one MODEL, then --options"
    name = first.split("=")[0].removeprefix("--")
    known = [*knowledge.flags, *SERVER_FLAGS, "host", "port", "served-model-name", "config", "model"]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"Did you mean --{close[0]}? " if close else ""
    return (f"--from-cmd: unknown flag {first.split('=')[0]}: not a vLLM {knowledge.series} flag this tool knows. "
            f"{hint}Remove it from the command line and add it under engine.flags in the written scenario "
            "(it is passed to vLLM unchecked there)")


class ConfigFileError(AutotunerError):
    """A `--config` file vLLM could not use: unreadable (`exc` says why), or not a mapping."""

    def __init__(self, path: str, exc: Exception | None = None) -> None:
        super().__init__(f"{path}: {exc}" if exc is not None else f"{path}: not a mapping of option names")
        self.path = path
        self.exc = exc


def read_config_file(path: str) -> dict[str, object]:
    """`vllm serve --config f.yaml`: long option names (dashes or underscores) and their values."""
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigFileError(path, exc) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(path)
    return {flag_name(str(k)): v for k, v in data.items()}


def config_file_argv(path: str) -> list[str]:
    """The options vLLM reads from a `--config` file, as the command line it inserts them into."""
    return flag_argv(read_config_file(path))


def _config_file(path: str) -> dict[str, object]:
    """`--config f.yaml` of --from-cmd; the command line wins over it."""
    try:
        return read_config_file(path)
    except ConfigFileError as exc:
        if exc.exc is None:
            raise CommandLineError(f"--config {path}: a vLLM config file is a mapping of option names") from None
        raise CommandLineError(f"--from-cmd --config {path}: cannot read it ({exc.exc}); run init where the file "
                               "is readable, or leave --config out") from None
