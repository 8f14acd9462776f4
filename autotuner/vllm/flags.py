"""vLLM's serving flags as we know them: name, type and allowed values, so that a bad value is bad
input before any launch (`--set max-num-batched-tokens=abc` exits 2, as `vllm serve` would).

Names are long options without dashes (`max-num-batched-tokens`): `flag_name` is the one spelling
rule (vLLM reads `--max_num_seqs` as `--max-num-seqs`), `flag_argv` the one rendering back to
options. The table holds the flags the tuner searches, the simulator models, and the common ones a
scenario fixes; a name not in it is passed to the engine unchecked (vLLM has hundreds) and
`autotuner doctor` says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from autotuner.errors import UserInputError

# The flag along which the memory wall is crossed: the share of each GPU vLLM takes, its KV cache the rest.
UTILIZATION = "gpu-memory-utilization"

# A flag's value as a scenario, `--set` or a command line gives it, typed as vLLM parses it.
FlagValue = bool | int | float | str | list[str | int | float]
FlagKind = Literal["int", "float", "bool", "str", "list"]

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def flag_name(raw: str) -> str:
    """A flag's long name as the table keys it: `--max_num_seqs` and `max-num-seqs` are `max-num-seqs`
    (vLLM's FlexibleArgumentParser reads underscores as dashes)."""
    return raw.removeprefix("--").replace("_", "-")


def flag_argv(flags: Mapping[str, object]) -> list[str]:
    """vLLM's long options: true → --name, false → --no-name, a list → --name a b."""
    argv: list[str] = []
    for name, value in flags.items():
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        elif isinstance(value, list):
            argv += [f"--{name}", *map(str, value)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


class FlagTypeError(UserInputError):
    """A flag value vLLM's argument parser would refuse (exit 2 there, bad input here)."""


def human_readable_int(value: str) -> int:
    """vLLM's parser for sizes and lengths: `25600`, `25.6k` (×1000), `32K` (×1024), `4M`, `1G`."""
    value = value.strip()
    match = _HUMAN.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                             f"{number}{suffix.lower()} instead?")
        return int(number) * _BINARY[suffix]
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """`max-model-len`'s parser: a human-readable int, or `auto`/-1 (-1: let vLLM pick)."""
    return -1 if value.strip().lower() in ("auto", "-1") else human_readable_int(value)


@dataclass(frozen=True)
class FlagSpec:
    name: str
    kind: FlagKind
    help: str = ""
    choices: tuple[str, ...] | None = None
    human: bool = False  # int parsed by human_readable_int (`8k`, `4M`)
    auto: bool = False  # also `auto` (or -1): vLLM picks the value
    modeled: bool = False  # the simulator's behaviour depends on it (else it accepts and ignores it)

    @property
    def parser(self) -> Callable[[str], object]:
        """The argparse `type` vLLM uses for this flag."""
        if self.kind == "int":
            return human_readable_int_or_auto if self.auto else human_readable_int if self.human else int
        if self.kind == "float":
            return float
        return str

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        integer = "an integer" + (" (e.g. 8192, 8k, 32K)" if self.human else "") + (" or auto" if self.auto else "")
        return {"int": integer, "float": "a number",
                "bool": "true or false", "str": "a string", "list": "a list of values"}[self.kind]

    def coerce(self, value: object, where: str) -> FlagValue:
        """The value as vLLM would parse it; raises FlagTypeError naming `where` and what is allowed."""
        try:
            return self._coerce(value)
        except (TypeError, ValueError):
            raise FlagTypeError(f"{where}: {value!r} is not a valid value for --{self.name}: expected "
                                f"{self.allowed()}") from None

    def _coerce(self, value: object) -> FlagValue:
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise ValueError
        if self.kind == "list":
            if isinstance(value, list):
                return value
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                return [value]
            raise ValueError
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError
        if self.kind == "int":
            if self.auto and str(value).strip().lower() in ("auto", "-1"):
                return "auto"
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return value if isinstance(value, int) else self.parser(value)  # type: ignore[return-value]
        if self.kind == "float":
            number = float(value)
            if not math.isfinite(number):  # `nan`, `inf`: float() reads them, no flag means them
                raise ValueError
            return number
        text = str(value)
        if self.choices and text not in self.choices:
            raise ValueError
        return text


def _specs(*specs: FlagSpec) -> dict[str, FlagSpec]:
    return {s.name: s for s in specs}


# vLLM 0.32's flags (vllm/engine/arg_utils.py): the ones we search, model or see in deployments.
FLAGS_0_32: Mapping[str, FlagSpec] = _specs(
    FlagSpec("max-num-batched-tokens", "int", "token budget per scheduler step", human=True, modeled=True),
    FlagSpec("max-num-seqs", "int", "requests running at once", modeled=True),
    FlagSpec("max-model-len", "int", "context length (auto: the model's)", human=True, modeled=True, auto=True),
    FlagSpec("gpu-memory-utilization", "float", "share of each GPU the engine may use", modeled=True),
    FlagSpec("cpu-offload-gb", "float", "GiB of weights per GPU kept in host RAM", modeled=True),
    FlagSpec("tensor-parallel-size", "int", "GPUs per model replica", modeled=True),
    FlagSpec("enable-chunked-prefill", "bool", "split long prompts over steps", modeled=True),
    FlagSpec("enable-prefix-caching", "bool", "reuse KV blocks of shared prefixes", modeled=True),
    FlagSpec("block-size", "int", "tokens per KV block", modeled=True),
    FlagSpec("enforce-eager", "bool", "no CUDA graphs", modeled=True),
    FlagSpec("kv-cache-dtype", "str", "KV cache element type", modeled=True, choices=(
        "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
        "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")),
    FlagSpec("dtype", "str", "weights and activations type",
             choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    FlagSpec("seed", "int"),
    FlagSpec("tokenizer", "str"),
    FlagSpec("revision", "str"),
    FlagSpec("download-dir", "str"),
    FlagSpec("load-format", "str"),
    FlagSpec("quantization", "str"),
    FlagSpec("swap-space", "float"),
    FlagSpec("kv-cache-memory-bytes", "int", "fixed KV cache size (overrides utilization)", human=True),
    FlagSpec("pipeline-parallel-size", "int"),
    FlagSpec("data-parallel-size", "int"),
    FlagSpec("distributed-executor-backend", "str"),
    FlagSpec("generation-config", "str"),
    FlagSpec("shutdown-timeout", "int"),
    FlagSpec("uvicorn-log-level", "str", choices=("debug", "info", "warning", "error", "critical", "trace")),
    FlagSpec("trust-remote-code", "bool"),
    FlagSpec("disable-log-stats", "bool"),
    FlagSpec("disable-log-requests", "bool"),
    FlagSpec("max-num-partial-prefills", "int"),
    FlagSpec("long-prefill-token-threshold", "int"),
    FlagSpec("offload-backend", "str", "how offloaded weights are read", choices=("auto", "uva", "prefetch"),
             modeled=True),
    FlagSpec("offload-group-size", "int", "prefetch offload: group every G layers (0: off)", modeled=True),
    FlagSpec("offload-num-in-group", "int", "prefetch offload: offload the last K layers of each group",
             modeled=True),
    FlagSpec("offload-prefetch-step", "int", "prefetch offload: copy layers this many ahead", modeled=True),
)
