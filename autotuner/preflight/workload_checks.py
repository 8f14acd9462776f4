"""Do the workload's longest prompt and answer fit the context the engine will serve?"""

from __future__ import annotations

from autotuner.preflight.checklist import Check
from autotuner.scenario import LengthSettings, Scenario
from autotuner.vllm import FlagValue


def _max_len(d: LengthSettings) -> int | None:
    """The longest length this distribution produces, None when it is unbounded."""
    if d.kind == "fixed":
        top: int | None = d.value
    elif d.kind == "uniform":
        top = d.high
    else:
        top = None
    if d.max is not None:
        top = d.max if top is None else min(top, d.max)
    return top


def _context(scenario: Scenario, flags: dict[str, FlagValue]) -> tuple[int | None, str]:
    from autotuner.preflight.model_checks import scenario_model_limits

    value = flags.get("max-model-len")
    space = scenario.search_space or {}
    param = space.get("max-model-len") or space.get("max_model_len")
    if param is not None and param.high not in (None, "auto"):
        return int(float(param.high)), "search_space.max-model-len.high"  # type: ignore[arg-type]
    if isinstance(value, int) and not isinstance(value, bool):
        return value, "max-model-len"
    model = scenario_model_limits(scenario)
    if model is not None and model.derived_max_model_len is not None:
        return model.derived_max_model_len, "the model's max_position_embeddings"
    return None, ""


def check_workload(scenario: Scenario, flags: dict[str, FlagValue]) -> Check:
    r = scenario.workload.requests
    if r.kind == "trace":
        return Check("workload", "ok", "trace: each request's length is the engine's to check")
    context, source = _context(scenario, flags)
    prompt, output = _max_len(r.prompt_tokens), _max_len(r.output_tokens)
    if context is None:
        return Check("workload", "ok", "context length unknown until the engine starts (set max-model-len to "
                     "check here)")
    if prompt is None or output is None:
        return Check("workload", "warning", f"prompt or output lengths have no upper bound; the context is "
                     f"{context} tokens ({source})", "set max: on workload.requests.prompt_tokens and output_tokens")
    extra = r.shared_prefix_tokens if r.shared_prefix_fraction > 0 else 0
    need = prompt + output + extra
    if need > context:
        return Check("workload", "failed", f"the longest request needs {need} tokens (prompt {prompt}"
                     + (f" + shared prefix {extra}" if extra else "") + f" + output {output}), more than the "
                     f"context of {context} tokens ({source}): every such request would fail with HTTP 400",
                     "lower workload.requests.prompt_tokens / output_tokens, or raise max-model-len")
    return Check("workload", "ok", f"longest request {need} tokens ≤ context {context} ({source})")


def served_context(scenario: Scenario, flags: dict[str, FlagValue]) -> int | None:
    """The context vLLM will serve: max-model-len when set, else the model's derived length."""
    from autotuner.preflight.model_checks import scenario_model_limits

    value = flags.get("max-model-len")
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value > 0 else None  # -1: vLLM fits the context to memory itself
    if value is not None:
        return None
    model = scenario_model_limits(scenario)
    return model.derived_max_model_len if model is not None else None
