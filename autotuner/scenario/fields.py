"""What every part of the scenario shares: its strict base model, the bounds on numbers that drive work,
the name rules, and whether a scenario is being read back from the database."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
)

_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# A variable name as POSIX shells and systemd read it: anything else (`A;rm -rf`, a newline, `A=B`) would be
# code, not a name, in the `cmd`, `env` and systemd exports.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The scenario's name is a path component ($AUTOTUNER_HOME/logs/NAME, NAME.jsonl): no `/`, no leading `.`
# (so neither `.` nor `..`), short enough for any filesystem.
NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"
# Flags the tuner owns: a scenario may not fix them (the engine must bind where we say).
RESERVED_FLAGS = frozenset({"host", "port", "served-model-name", "api-key", "model", "config"})


def _stored(info: ValidationInfo) -> bool:
    """Validating a scenario read back from the database: its `${VAR}`s are names, not to be looked up
    (the variables may not exist where the study is exported)."""
    return bool(info.context and info.context.get("stored"))


class _Model(BaseModel):
    # Every number of a scenario drives work (counts, sizes, waits): NaN and infinity are never meant, and
    # neither is `true` for a number (strict: no bool for an int, no 1e29 float for an int, no "8" string).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


# Upper bounds where a number drives work: far beyond any real deployment, short of a hang.
DAY_S = 86400.0
MAX_TOKENS = 10_000_000  # a prompt or output length
MAX_REQUESTS = 1_000_000
Seconds = Annotated[float, Field(le=30 * DAY_S)]

