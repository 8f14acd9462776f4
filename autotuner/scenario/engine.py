"""The scenario's `engine:` section: which engine, its command, model, flags, environment and GPUs, and
the simulator's settings. `${VAR}` is looked up where a value is needed and stored as written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from autotuner.engine_kinds import KINDS, EngineKind
from autotuner.env_references import expand, only_references, variables
from autotuner.errors import ScenarioError, quoted
from autotuner.scenario.fields import (
    _FLAG_NAME,
    ENV_NAME,
    RESERVED_FLAGS,
    Seconds,
    _Model,
    _stored,
)
from autotuner.secrets import REDACTED, is_secret_name, remember
from autotuner.vllm import FlagValue, flag_name


class SimSettings(_Model):
    gpu: str = "rtx-3090"
    gpus: int | None = Field(default=None, ge=1, le=1024)
    speedup: float = Field(default=10.0, gt=0, le=1e6)
    seed: int = 0
    # Run-to-run coefficient of variation of the simulated engine (sim/noise.py); 0: deterministic.
    noise: float = Field(default=0.03, ge=0, le=0.5)


class EngineSettings(_Model):
    kind: EngineKind = "vllm"
    command: list[str] | None = Field(
        default=None,
        description="argv prefix before the model: default `vllm serve` (vllm) or the simulator (sim); "
        "`python -m vllm.entrypoints.openai.api_server --model` works too",
    )
    model: str = Field(min_length=1, max_length=4096)
    served_model_name: str | None = Field(default=None, min_length=1, max_length=1024)
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    gpus: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(default=None, max_length=1024)
    startup_timeout_s: Seconds = Field(default=900.0, gt=0)
    stop_grace_s: Seconds = Field(default=15.0, ge=0)
    release_timeout_s: Seconds = Field(default=60.0, ge=0)
    api_key_env: str | None = Field(default=None, description="name of the variable holding the API key")
    sim: SimSettings = SimSettings()
    # engine.model as the file wrote it when it uses `${VAR}`: looked up at load (the engine needs the
    # path), stored as written, like engine.env (a value is never stored, and need not exist at export).
    model_as_written: str | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _keep_model_as_written(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "model_as_written"}  # ours, never the file's
        model = data.get("model")
        if isinstance(model, str) and variables(model):
            data["model_as_written"] = model
        return data

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
        normalised: dict[str, FlagValue] = {}
        for name, value in flags.items():
            key = flag_name(name)
            if not _FLAG_NAME.match(key):
                raise ValueError(f"flag name {name!r} is not a vLLM long option (like max-num-seqs)")
            if key in RESERVED_FLAGS:
                raise ValueError(f"flag {key!r} is set by the tuner; use engine.served_model_name, "
                                 "engine.api_key_env or engine.model instead")
            normalised[key] = value
        return normalised

    @field_validator("command")
    @classmethod
    def _command(cls, command: list[str] | None) -> list[str] | None:
        if command is not None and (not command or not all(command)):
            raise ValueError("command must be a non-empty list of non-empty strings")
        return None if command is None else [expand(part) for part in command]

    @field_validator("model")
    @classmethod
    def _model(cls, model: str, info: ValidationInfo) -> str:
        try:
            model = expand(model)
        except ValueError:
            if not _stored(info):
                raise
            # A stored study read where its variable is not set (an export elsewhere): kept as written.
        # A local model is a path: a component over NAME_MAX is ENAMETOOLONG at the first stat().
        if any(len(part.encode()) > 255 for part in model.split("/")) or "\0" in model:
            raise ValueError(f"{quoted(model, 60)} is neither a model name nor a path (a part over 255 bytes, "
                             "or a NUL): give a Hugging Face id, a preset or a local directory")
        return model

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """Kept as written: `${VAR}` is looked up at launch (`resolved_env`), so the value never reaches
        the database. Checked here, so that a missing variable is bad input at load."""
        for key in env:
            if not ENV_NAME.match(key):
                raise ValueError(f"variable name {quoted(key, 60)} is not a POSIX name (letters, digits and _, "
                                 "not starting with a digit)")
        if not _stored(info):
            for key, value in env.items():
                resolved = expand(str(value))
                if is_secret_name(key) or any(is_secret_name(name) for name in variables(str(value))):
                    remember(resolved)
        return {k: str(v) for k, v in env.items()}

    @field_validator("api_key_env")
    @classmethod
    def _api_key(cls, name: str | None, info: ValidationInfo) -> str | None:
        if name is not None and not _stored(info):
            remember(os.environ.get(name))
        return name

    @field_serializer("model")
    def _model_as_stored(self, model: str) -> str:
        written = self.model_as_written
        if written is None:
            return model
        try:
            same = expand(written) == model
        except ValueError:
            same = written == model
        return written if same else model  # a model changed since (a model swap): the new one

    @field_serializer("env")
    def _env_as_stored(self, env: dict[str, str]) -> dict[str, str]:
        """`${VAR}` references as written; a literal value under a secret-looking name, masked."""
        return {k: v if not is_secret_name(k) or only_references(v) else REDACTED
                for k, v in env.items()}

    def resolved_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """engine.env with `${VAR}` looked up now: for the engine's process, never for storage."""
        try:
            return {k: expand(v, environ) for k, v in self.env.items()}
        except ValueError as exc:
            raise ScenarioError(f"engine.env: {exc}") from None

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name or self.model

    def command_prefix(self) -> list[str]:
        if self.command:
            return list(self.command)
        return list(KINDS[self.kind].default_command)

