"""What a refusal or a known-good config is valid for: the box (model, GPUs, engine version) and, for a
refusal, the workload too (a config refused under long prompts may serve short ones)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from autotuner.scenario import Scenario


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def box_fingerprint(identity: dict[str, Any] | None) -> str:
    """From production's identity (daemon.triggers.identity, as stored in the reference and each cycle)."""
    ident = identity or {}
    return _digest({"model": ident.get("model_fingerprint") or ident.get("root"),
                    "gpus": [g[0] for g in ident.get("gpus") or []], "engine": ident.get("vllm_version")})


def refusal_fingerprint(identity: dict[str, Any] | None, scenario: Scenario) -> str:
    return _digest({"box": box_fingerprint(identity),
                    "workload": scenario.workload.requests.model_dump(mode="json")})
