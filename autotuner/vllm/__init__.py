"""What we know of vLLM, by version: flag names and types, defaults per platform, startup rules.

The one place for these facts: the tuner (search space, baseline, pre-launch check), the simulator
(its argument parser and validation), `measure --set` and the preflight all read them from here.
"""

from autotuner.vllm.defaults import Platform, scheduler_defaults
from autotuner.vllm.flags import FlagSpec, FlagTypeError, FlagValue, flag_argv, flag_name, human_readable_int
from autotuner.vllm.rules import ModelLimits, ServeConfig, VllmRuleError, resolve
from autotuner.vllm.versions import KNOWN, SIMULATED_VERSION, VllmKnowledge, is_known, knowledge_for, series_of

__all__ = [
    "KNOWN",
    "SIMULATED_VERSION",
    "FlagSpec",
    "FlagTypeError",
    "FlagValue",
    "ModelLimits",
    "Platform",
    "ServeConfig",
    "VllmKnowledge",
    "VllmRuleError",
    "flag_argv",
    "flag_name",
    "human_readable_int",
    "is_known",
    "knowledge_for",
    "resolve",
    "scheduler_defaults",
    "series_of",
]
