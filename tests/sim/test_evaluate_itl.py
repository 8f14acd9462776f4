"""Inter-token latency in virtual time is the gap between two tokens of one request, not TPOT."""

from __future__ import annotations

import pytest

from autotuner.scenario import Scenario
from autotuner.sim.args import build_config, parse_args
from autotuner.sim.evaluate import EvalRequest, evaluate
from autotuner.tuner.runners import VirtualRunner


def _config():  # type: ignore[no-untyped-def]
    return build_config(parse_args(["llama-2-7b", "--sim-gpu", "a100-80gb", "--max-num-batched-tokens", "4096"]), {})


def test_a_long_prefill_arriving_mid_decode_shows_in_itl_not_in_tpot() -> None:
    config = _config()
    decoding = EvalRequest(list(range(1, 65)), 200, arrival=0.0)
    # Long prompts arriving while the first request decodes: each 3500-token prefill holds up one of
    # its tokens (5 stalled gaps of ~200: the top 2.5 %).
    long_prompts = [EvalRequest([(7 * k + i) % 32000 + 1 for k in range(3500)], 1, arrival=0.3 * (i + 1))
                    for i in range(5)]
    ev = evaluate(config, [decoding, *long_prompts], concurrency=None)
    assert ev.outcome == "ok"
    m = ev.metrics
    assert m["itl_p99_s"] is not None and m["itl_p50_s"] is not None
    # The ITL tail sees the stalls; the per-request mean (TPOT) smooths them away.
    assert m["itl_p99_s"] > 2 * m["itl_p50_s"]
    assert m["itl_p99_s"] > 2 * m["tpot_p99_s"]  # type: ignore[operator]


def test_no_second_token_means_no_itl() -> None:
    ev = evaluate(_config(), [EvalRequest(list(range(1, 65)), 1, arrival=0.0)], concurrency=None)
    assert ev.metrics["itl_p99_s"] is None and ev.metrics["completed"] == 1


def test_virtual_runner_reports_the_evaluator_itl() -> None:
    scenario = Scenario.model_validate({
        "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "sim": {"gpu": "a100-80gb"}},
        "workload": {"requests": {"count": 12, "prompt_tokens": "2000-6000", "output_tokens": 64},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}},
    })
    result = VirtualRunner(scenario).evaluate({"max-num-batched-tokens": 2048})
    m = result.metrics
    assert result.outcome == "ok"
    assert m["itl_p99_s"] is not None and m["tpot_p50_s"] is not None
    assert m["itl_p99_s"] == pytest.approx(_evaluator_itl_p99(scenario), rel=1e-9)


def _evaluator_itl_p99(scenario: Scenario) -> float:
    runner = VirtualRunner(scenario)
    config = build_config(parse_args(runner._argv({"max-num-batched-tokens": 2048})), {})
    reqs, concurrency = runner.requests(config.model.vocab_size)
    value = evaluate(config, reqs, concurrency).metrics["itl_p99_s"]
    assert isinstance(value, float)
    return value
