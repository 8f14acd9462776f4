"""Flag values typed as vLLM parses them, and checked against its startup rules, before any launch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue, Platform, VllmKnowledge, flag_name

_PARAM_KINDS = {"int": ("int",), "float": ("float", "int"), "bool": ("bool",), "categorical": ()}


def check_flags(scenario: Scenario, vllm: VllmKnowledge, overrides: Mapping[str, FlagValue] | None,
                platform: Platform | None) -> list[Check]:
    """Types of engine.flags, current_config, --set values and search_space; then vLLM's rules on
    what `measure` launches (fixed flags and --set) — for `tune`, on the fixed flags with vLLM's
    defaults (a warning: candidates that break a rule are recorded without a launch)."""
    from autotuner.tuner.space import build_space, model_limits

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
    violation = vllm.violation(merged, platform, model_limits(scenario), {**os.environ, **engine.env})
    if violation is not None:
        where = "engine.flags and --set" if given else "engine.flags"
        if overrides is not None:
            checks.append(Check("flag rules", "failed", f"{where}: vLLM would refuse to start: {violation}",
                                "change the values so that vLLM's rule holds"))
        else:
            checks.append(Check("flag rules", "warning", f"{where} with vLLM's defaults: vLLM would refuse to "
                                f"start: {violation}", "change engine.flags; candidates that break the rule "
                                "are recorded as invalid-flags without a launch"))
    if not checks or all(c.name != "flags" for c in checks):
        searched = f"{len(scenario.search_space)} searched" if scenario.search_space else "the default search space"
        checks.insert(0, Check("flags", "ok", f"{len(merged)} fixed, {searched}; values typed as vLLM "
                               f"{vllm.series} parses them"))
    if all(c.name != "flag rules" for c in checks):
        checks.append(Check("flag rules", "ok", "vLLM's startup rules hold" + (
            "" if platform is not None else " (platform-dependent defaults unchecked: no device seen)")))
    return checks
