"""`include_prompt_tokens`: lengths replayed first, each once, then the distribution (the prompts that
crashed production, in the re-tune's workload and its soak)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autotuner.scenario import RequestSettings, WorkloadSettings
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadError, WorkloadSpec
from tests.workload.test_requests import FakeTokenizer, build

CRASHED = (7000, 40, 2999)


def spec(count: int, include: tuple[int, ...] = ()) -> WorkloadSpec:
    syn = SyntheticRequests(count, LengthDist("uniform", low=20, high=3000), LengthDist("fixed", value=8),
                            include_prompt_tokens=include)
    return WorkloadSpec(syn, Arrivals("concurrency"), warmup_requests=2, seed=5)


async def test_included_lengths_are_the_first_measured_prompts_and_the_rest_unchanged() -> None:
    tok = FakeTokenizer()
    plain = await build(tok, spec(6))
    with_crash = await build(tok, spec(6, CRASHED))
    targets = [r.target_prompt_tokens for r in with_crash.requests]
    # Warm-up first (drawn), then the crashing prompts exactly, then the distribution as without them.
    assert targets[2:5] == list(CRASHED)
    assert [tok.count_request(r.prompt, r.messages) for r in with_crash.requests[2:5]] == list(CRASHED)
    before = [r.target_prompt_tokens for r in plain.requests]
    assert targets[:2] == before[:2] and targets[5:] == before[5:] and len(targets) == len(before) == 8


async def test_a_count_smaller_than_the_list_grows_to_hold_it() -> None:
    built = await build(FakeTokenizer(), spec(1, CRASHED))
    assert [r.target_prompt_tokens for r in built.requests][2:] == list(CRASHED)
    with pytest.raises(WorkloadError, match="include_prompt_tokens"):
        SyntheticRequests(1, LengthDist("fixed", value=8), LengthDist("fixed", value=8), include_prompt_tokens=(0,))


def test_the_scenario_field_reaches_the_spec_and_is_synthetic_only() -> None:
    settings = WorkloadSettings.model_validate({"requests": {"include_prompt_tokens": list(CRASHED)}})
    built = settings.to_spec(None)
    assert isinstance(built.requests, SyntheticRequests) and built.requests.include_prompt_tokens == CRASHED
    assert "replayed first" in (RequestSettings.model_fields["include_prompt_tokens"].description or "")
    with pytest.raises(ValidationError, match="include_prompt_tokens is for synthetic requests"):
        RequestSettings.model_validate({"kind": "trace", "path": "t.jsonl", "include_prompt_tokens": [10]})
    with pytest.raises(ValidationError):
        RequestSettings.model_validate({"include_prompt_tokens": [0]})
