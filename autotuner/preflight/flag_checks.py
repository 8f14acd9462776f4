"""Flag values typed as vLLM parses them, and checked against its startup rules, before any launch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue, Platform, VllmKnowledge, VllmRuleError, flag_name
from autotuner.vllm.rules import LONG_MAX_MODEL_LEN_VAR

_PARAM_KINDS = {"int": ("int",), "float": ("float", "int"), "bool": ("bool",), "categorical": ()}


def check_flags(scenario: Scenario, vllm: VllmKnowledge, overrides: Mapping[str, FlagValue] | None,
                platform: Platform | None) -> list[Check]:
    """Types of engine.flags, current_config, --set values and search_space; then vLLM's rules on
    what `measure` launches (fixed flags and --set) — for `tune`, on the fixed flags with vLLM's
    defaults (a warning: candidates that break a rule are recorded without a launch)."""
    from autotuner.preflight.model_checks import scenario_model_limits
    from autotuner.tuner.space import build_space

    engine = scenario.engine
    try:
        if overrides is None:  # a study: its search space must be usable
            build_space(scenario)
        fixed = vllm.coerce_all(engine.flags, "engine.flags")
        vllm.coerce_all(scenario.current_config, "current_config")
        given = vllm.coerce_all(overrides or {}, "--set")
    except UserInputError as exc:
        return [Check("flags", "failed", str(exc), "give each flag a value of the type vLLM expects, and search "
                      "at least one flag")]
    checks: list[Check] = []
    for raw, param in (scenario.search_space or {}).items():
        name = flag_name(raw)
        spec = vllm.spec(name)
        if spec is None:
            continue
        if param.type == "categorical":
            try:
                for choice in param.choices or []:
                    vllm.coerce(name, choice, f"search_space.{raw}.choices")
            except UserInputError as exc:
                return [Check("flags", "failed", str(exc), "list only values vLLM accepts")]
        elif spec.kind not in _PARAM_KINDS[param.type]:
            return [Check("flags", "failed", f"search_space.{raw}: type {param.type}, but --{name} takes "
                          f"{spec.allowed()}", f"use type {spec.kind} for {raw}")]
    from autotuner.trials.offload_axis import FREED, MODE

    axis = (MODE, FREED)  # the offload axis: ours, turned into vLLM's flags per candidate
    names = [*fixed, *given, *(n for n in scenario.search_space or {} if n.removeprefix("--") not in axis)]
    unknown = vllm.unknown(dict.fromkeys(flag_name(n) for n in names))
    if unknown and not backend_for(engine).accepts_unknown_flags:
        return [Check("flags", "failed", f"the simulator does not know --{', --'.join(unknown)}",
                      "leave them out, or use engine.kind: vllm with a real vLLM")]
    if unknown:
        checks.append(Check("flags", "warning", f"--{', --'.join(unknown)} not in vLLM {vllm.series}'s flags "
                            "autotuner knows: passed to the engine unchecked", "check their spelling in "
                            "`vllm serve --help`"))
    merged = {**fixed, **given}
    try:
        vllm.resolve(merged, platform, scenario_model_limits(scenario), {**os.environ, **engine.env})
    except VllmRuleError as exc:
        checks.append(_rule_check(exc, scenario, overrides, given, axis))
    if not checks or all(c.name != "flags" for c in checks):
        searched = f"{len(scenario.search_space)} searched" if scenario.search_space else "the default search space"
        checks.insert(0, Check("flags", "ok", f"{len(merged)} fixed, {searched}; values typed as vLLM "
                               f"{vllm.series} parses them"))
    if all(c.name != "flag rules" for c in checks):
        checks.append(Check("flag rules", "ok", "vLLM's startup rules hold" + (
            "" if platform is not None else " (platform-dependent defaults unchecked: no device seen)")))
    return checks


def _rule_check(exc: VllmRuleError, scenario: Scenario, overrides: Mapping[str, FlagValue] | None,
                given: Mapping[str, FlagValue], axis: tuple[str, str]) -> Check:
    """A broken rule fails the check when no candidate can escape it (`measure`, or a rule on flags the
    study does not search); a rule only some candidates break is a warning (they are recorded as
    invalid-flags without a launch)."""
    where = "engine.flags and --set" if given else "engine.flags"
    searched = {flag_name(n) for n in scenario.search_space or {}}
    if searched & set(axis):  # the offload axis sets vLLM's offload flags per candidate
        searched |= {"cpu-offload-gb", "offload-backend", "offload-group-size", "offload-num-in-group",
                     "offload-prefetch-step"}
    if scenario.search_space is None:
        searched |= {"max-num-batched-tokens", "gpu-memory-utilization", "cpu-offload-gb"}
    if overrides is None and set(exc.flags) & searched:
        return Check("flag rules", "warning", f"{where} with vLLM's defaults: vLLM would refuse to start: "
                     f"{exc.reason}", "change engine.flags; candidates that break the rule are recorded as "
                     "invalid-flags without a launch")
    every = "" if overrides is not None else " (with every candidate: the rule is on flags the study does not search)"
    return Check("flag rules", "failed", f"{where}: vLLM would refuse to start{every}: {exc.reason}",
                 _rule_fix(exc))


def _rule_fix(exc: VllmRuleError) -> str:
    if LONG_MAX_MODEL_LEN_VAR in exc.text:
        return (f"if production serves this context, it runs with {LONG_MAX_MODEL_LEN_VAR}=1: add "
                f"{LONG_MAX_MODEL_LEN_VAR}: \"1\" to engine.env; otherwise lower engine.flags.max-model-len "
                "to the model's own")
    if exc.text.startswith("World size"):
        return ("lower engine.flags.tensor-parallel-size (× pipeline-parallel-size) to the GPUs the monitor "
                "sees, or list more GPUs in engine.gpus")
    if "attention heads" in exc.text:
        return "use a tensor-parallel-size that divides the model's attention heads"
    return "change the values so that vLLM's rule holds"
