"""Does the model resolve: a local directory with config.json, a hub name in the local Hugging Face
cache, or (a warning) a hub name the engine will download on its first start?"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from autotuner.backends import backend_for
from autotuner.errors import ModelSpecError, UserInputError
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import ModelLimits
from autotuner.vllm.rules import derived_max_model_len

_HUB_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def hub_cache(env: Mapping[str, str]) -> Path:
    """huggingface_hub's cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


def check_model(scenario: Scenario) -> Check:
    from autotuner.engine.launch import refuse_option_like  # the launcher's rule, checked before anything runs

    engine = scenario.engine
    model = engine.model
    try:
        refuse_option_like(model, engine.name)
    except UserInputError as exc:
        key, _, what = str(exc).partition(": ")
        return Check("model", "failed", f"{key}: {what.partition('; ')[0]}",
                     "give a model directory (./ before a relative one) or a Hugging Face id")
    if backend_for(engine).simulated:
        from autotuner.catalog.models import load_model

        try:
            spec = load_model(model)
        except ModelSpecError as exc:
            return Check("model", "failed", f"engine.model: {exc}",
                         "name a simulator preset or a directory with a Hugging Face config.json")
        return Check("model", "ok", f"{spec.name}: {spec.num_layers} layers, {spec.weight_bytes / 2**30:.1f} GiB")
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            return Check("model", "failed", f"engine.model: {path} is a file, not a model directory",
                         "point engine.model at the directory that holds config.json")
        if not (path / "config.json").is_file():
            return Check("model", "failed", f"engine.model: {path} has no config.json",
                         "point engine.model at the model's directory (the one with config.json and the weights)")
        return Check("model", "ok", f"local directory {path}")
    if _looks_like_path(model) or not _HUB_NAME.match(model):
        return Check("model", "failed", f"engine.model: {model} is not a local folder and is not a valid model "
                     "identifier", "fix the path (it must exist on this machine) or use a hub name like ORG/NAME")
    env = {**os.environ, **engine.env}
    cache = hub_cache(env)
    cached = cache / ("models--" + model.replace("/", "--"))
    if (cached / "snapshots").is_dir() and any((cached / "snapshots").iterdir()):
        return Check("model", "ok", f"{model} in the Hugging Face cache {cache}")
    if env.get("HF_HUB_OFFLINE") in ("1", "true", "True", "ON", "YES"):
        return Check("model", "failed", f"engine.model: {model} is not in the Hugging Face cache {cache} and "
                     "HF_HUB_OFFLINE is set", f"download it first (huggingface-cli download {model}) or unset "
                     "HF_HUB_OFFLINE")
    return Check("model", "warning", f"{model} is not in the Hugging Face cache {cache}: the engine will download "
                 "it on its first start", f"download it first (huggingface-cli download {model}) so that "
                 "engine.startup_timeout_s does not have to cover the download")


def scenario_model_limits(scenario: Scenario) -> ModelLimits | None:
    """What vLLM's rules need of the model: a preset's shape, or for a local directory its heads and
    the context vLLM derives from its config.json (the same derivation vLLM runs at startup)."""
    from autotuner.tuner.space import model_limits

    limits = model_limits(scenario)
    if limits is None or backend_for(scenario).simulated:
        return limits
    try:
        data = json.loads((Path(scenario.engine.model).expanduser() / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return limits
    derived = derived_max_model_len(data) if isinstance(data, dict) else None
    if derived is None:
        return limits
    return replace(limits, derived_max_model_len=derived[0], max_len_key=derived[1])
