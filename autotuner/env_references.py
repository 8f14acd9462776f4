"""`${VAR}` references to environment variables in configuration values (a scenario's engine.command,
engine.model and engine.env, the daemon's storage URL): expanded where the value is used, kept as
written where it is stored, so that a secret's value never reaches a file or the database.

Its own module, below the scenario: the daemon's configuration and the exporter read the same rule.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with each `${VAR}` replaced by its value; raises ValueError naming a variable not set."""
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ValueError(f"{text!r} uses ${{{name}}}, which is not set in the environment")
        return env[name]

    return _VAR.sub(value, text)


def variables(text: str) -> list[str]:
    """The names a `${VAR}` text refers to."""
    return _VAR.findall(text)


def only_references(text: str) -> bool:
    """The text is nothing but `${VAR}` references (whitespace aside)."""
    return bool(variables(text)) and not _VAR.sub("", text).strip()
