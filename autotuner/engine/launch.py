"""From a scenario and a candidate's flags to the argv and environment of one engine process.

argv lists only, never a shell; the engine binds 127.0.0.1 on a port we chose; the API key travels
in the environment (VLLM_API_KEY), never on the command line where `ps` and our database would see
it. The engine's environment is ours less the secrets it was not asked for (`secrets.child_environment`:
the daemon's token, a database password, secret-named variables not named in engine.env/api_key_env).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotuner.engine.ports import free_port
from autotuner.errors import UserInputError
from autotuner.scenario import RESERVED_FLAGS, Scenario
from autotuner.secrets import child_environment, is_secret_name
from autotuner.vllm import FlagValue, VllmKnowledge, flag_argv, flag_name, knowledge_for

API_KEY_VAR = "VLLM_API_KEY"
REDACTED = "***"


def parse_set(items: list[str], vllm: VllmKnowledge | None = None) -> dict[str, FlagValue]:
    """`--set NAME=VALUE` items: NAME a vLLM long option without dashes; true/false for booleans. A flag
    vLLM's table knows gets its type (`abc` for an integer flag is bad input, before any launch)."""
    from autotuner.errors import quoted  # imported here: the rest of this module is not this function's

    vllm = vllm or knowledge_for(None)
    out: dict[str, FlagValue] = {}
    for item in items:
        if len(item) > 4096:
            raise UserInputError(f"--set {quoted(item, 60)}: longer than 4096 characters")
        name, sep, raw = item.partition("=")
        name = flag_name(name.strip())
        if not sep or not name:
            raise UserInputError(f"--set {item!r}: expected NAME=VALUE, e.g. --set max-num-batched-tokens=1024")
        if name in RESERVED_FLAGS:
            raise UserInputError(f"--set {item!r}: --{name} is set by the tuner; use the scenario's engine.model, "
                                 "engine.served_model_name or engine.api_key_env")
        spec = vllm.spec(name)
        out[name] = spec.coerce(raw.strip(), f"--set {item}") if spec is not None \
            else _parse_value(raw.strip(), f"--set {quoted(item, 60)}")
    return out


def _parse_value(raw: str, where: str = "--set") -> FlagValue:
    import math

    from autotuner.errors import quoted

    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            continue
        # `nan`, `inf` and 400 digits parse as floats, but no vLLM flag means them: bad input, not a number.
        if (isinstance(value, float) and not math.isfinite(value)) or (isinstance(value, int)
                                                                       and abs(value) >= 2**63):
            raise UserInputError(f"{where}: {quoted(raw, 60)} is not a finite number")
        return value
    return raw


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    port: int
    served_name: str
    flags: dict[str, FlagValue]  # fixed flags + candidate, as the engine gets them
    gpu_indices: list[int] | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def redacted_env(self) -> dict[str, str]:
        """What we changed in the environment, secrets hidden: safe to log and store."""
        return {k: (REDACTED if _secret(k) else v) for k, v in self.env.items() if os.environ.get(k) != v}

    def headers(self) -> dict[str, str]:
        key = self.env.get(API_KEY_VAR)
        return {"Authorization": f"Bearer {key}"} if key else {}


def refuse_option_like(model: str, served_name: str) -> None:
    """A model (positional on vLLM's command line) or served name that starts with `-` would be read as
    an option: `--trust-remote-code`, `--config=/tmp/x`. Such a value comes from a scenario, or from what
    production's /v1/models answers after a model swap: data, never an option."""
    for key, value in (("engine.model", model), ("engine.served_model_name", served_name)):
        if value.startswith("-"):
            shown = value if len(value) <= 80 else value[:80] + "…"
            raise UserInputError(f"{key}: {shown!r} starts with '-' and would be read as a vLLM option; give a "
                                 "model directory (./ before a relative one) or a Hugging Face id")


def _secret(name: str) -> bool:
    return is_secret_name(name)


def plan_launch(scenario: Scenario, candidate: Mapping[str, FlagValue], port: int | None = None,
                environ: Mapping[str, str] | None = None, extras: Sequence[str] = ()) -> LaunchPlan:
    """The engine's argv and environment; `extras`: what its backend adds after vLLM's flags (the
    simulator's `--sim-*`)."""
    environ = os.environ if environ is None else environ
    engine = scenario.engine
    refuse_option_like(engine.model, engine.name)
    flags: dict[str, FlagValue] = {**engine.flags, **candidate}
    port = port or free_port()
    argv = [*engine.command_prefix(), engine.model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", engine.name, *flag_argv(flags)]
    argv += extras
    asked = [*engine.env, *([engine.api_key_env] if engine.api_key_env else [])]
    env = {**child_environment(environ, keep=asked), **engine.resolved_env(environ)}
    env.pop(API_KEY_VAR, None)  # only the key the scenario names reaches the engine
    if engine.gpus is not None:
        # NVML numbers GPUs by PCI bus; CUDA, by default, fastest first. Make them agree, so the
        # GPUs we watch are the GPUs the engine uses.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, engine.gpus))
    if engine.api_key_env:
        key = environ.get(engine.api_key_env)
        if not key:
            raise UserInputError(f"engine.api_key_env names {engine.api_key_env}, which is not set: "
                                 f"export {engine.api_key_env}=... before running")
        env[API_KEY_VAR] = key
    return LaunchPlan(argv, env, port, engine.name, flags, engine.gpus)
