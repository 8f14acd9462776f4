"""vLLM 0.32's prefetch offload backend: its flags and rules (one module of vLLM knowledge, shared by the
tuner and the simulator), the simulator's memory, timing and log lines for it, and the issue's
acceptance case (Llama-3-70B, 8× RTX 3090, TP 8)."""

from __future__ import annotations

import pytest

from autotuner.engine import classify
from autotuner.scenario import Scenario
from autotuner.sim.args import VllmArgError, build_config, parse_args
from autotuner.sim.evaluate import SyntheticWorkload, evaluate
from autotuner.sim.memory import plan_startup, prefetch_init_line
from autotuner.trials.offload_axis import LayerShape, from_flags, prefetch_plan, to_flags
from autotuner.trials.outcomes import Outcome
from autotuner.trust.offload import PREFETCHED
from autotuner.tuner.space import FlagRules
from autotuner.vllm import VllmRuleError, resolve

GIB = 1 << 30
ACCEPTANCE = ["llama-3-70b", "-tp", "8", "--sim-gpu", "rtx-3090", "--max-model-len", "8192", "--sim-noise", "0"]
# Decode-heavy: short prompts, long answers, more concurrent context than the default KV cache holds.
DECODE_HEAVY = SyntheticWorkload(prompts=96, prompt_tokens=(600, 800), output_tokens=512, concurrency=96)


def config(*argv: str):
    return build_config(parse_args([*ACCEPTANCE, *argv]), {})


def run(*argv: str):
    c = config(*argv)
    return evaluate(c, DECODE_HEAVY.requests(c.model.vocab_size), DECODE_HEAVY.concurrency), c


@pytest.mark.parametrize(("flags", "message"), [
    ({"offload-group-size": 8, "offload-num-in-group": 9},
     "Value error, offload_num_in_group (9) must be <= offload_group_size (8)"),
    ({"offload-group-size": 8, "offload-prefetch-step": 0},
     "Value error, offload_prefetch_step (0) must be >= 1 when prefetch offloading is enabled"),
    # An explicit prefetch backend with no group: vLLM's validator compares K (default 1) with G = 0.
    ({"offload-backend": "prefetch"}, "Value error, offload_num_in_group (1) must be <= offload_group_size (0)"),
    ({"offload-num-in-group": 0}, "Input should be greater than or equal to 1"),
])
def test_invalid_prefetch_flags_are_refused_like_vllm_by_both_tuner_and_simulator(flags, message) -> None:
    argv = [a for k, v in flags.items() for a in (f"--{k}", str(v))]
    with pytest.raises(VllmArgError) as info:
        config(*argv)
    assert info.value.exit_code == 1 and message in info.value.message
    assert classify.classify(info.value.message.splitlines()).failure == Outcome.INVALID_FLAGS
    scenario = Scenario.model_validate({"engine": {"kind": "sim", "model": "llama-3-70b",
                                                   "sim": {"gpu": "rtx-3090", "gpus": 8}}})
    rules = FlagRules(scenario, ["NVIDIA GeForce RTX 3090 (23.69 GiB, simulated)"] * 8, "0.32.0 (simulated)")
    verdict = rules.violation({"tensor-parallel-size": 8, **flags})
    assert verdict is not None and message.removeprefix("Value error, ") in verdict


def test_backends_resolve_as_vllm_picks_them() -> None:
    # vLLM warns but runs when both backends' fields are set: `auto` picks prefetch, an explicit one wins.
    both = {"cpu-offload-gb": 2.0, "offload-group-size": 8}
    assert resolve(both).offload_backend == "prefetch"
    assert resolve({**both, "offload-backend": "uva"}).offload_backend == "uva"
    assert resolve({"cpu-offload-gb": 2.0}).offload_backend == "uva"
    assert resolve({}).offload_backend == "none"
    with pytest.raises(VllmRuleError):
        resolve({"offload-group-size": -1})


def test_prefetch_frees_its_layers_less_the_buffers_and_logs_like_vllm() -> None:
    base = plan_startup(config())
    c = config("--offload-group-size", "8", "--offload-num-in-group", "1", "--offload-prefetch-step", "2")
    assert (c.offload_backend, c.prefetch_layers) == ("prefetch", 10)  # layers 7, 15, …, 79
    plan = plan_startup(c)
    assert base.weights_bytes - plan.weights_bytes == 8 * c.layer_bytes  # 10 offloaded, 2 buffered
    assert plan.num_blocks > base.num_blocks
    line = prefetch_init_line(c)
    assert line.startswith("[PrefetchOffloader] Initialized 10 modules. Total GPU memory saved: ")
    match = PREFETCHED.search(line)  # the trust check reads the same line back
    assert match is not None and abs(float(match.group(2)) * 1e9 - 10 * c.layer_bytes) < 1e5


def test_prefetch_beats_uva_freeing_the_same_memory_on_decode_but_not_3x() -> None:
    """The issue's acceptance case. The issue hoped for ≥ 3×; the model gives ~1.3×, and cannot give
    more than 2×: both backends move the same bytes over PCIe each forward pass (the host fabric's
    64 GB/s shared by 8 GPUs: ~0.27 s for ~2.2 GiB per GPU), UVA adds that to the step's compute,
    prefetch overlaps the two, so step_uva / step_prefetch = (compute + copy) / max(compute, copy) ≤ 2,
    and decode steps of a 70B at TP 8 compute for less than the copy takes."""
    none, c = run()
    shape = LayerShape(c.model.num_layers, c.layer_bytes / GIB)
    plan = prefetch_plan(2.0, shape)
    freed = plan.freed_gib(shape)
    assert 2.0 <= freed < 2.5
    uva, _ = run("--cpu-offload-gb", f"{freed:.4f}")
    prefetch, pc = run(*[f"--{k}={v}" for k, v in plan.flags().items()])
    assert none.outcome == uva.outcome == prefetch.outcome == "ok"
    assert pc.offload_backend == "prefetch"
    # The same memory freed: the KV caches match within a block per GPU's rounding.
    assert abs(prefetch.kv_cache_tokens - uva.kv_cache_tokens) <= 64
    assert prefetch.kv_cache_tokens > none.kv_cache_tokens + 50_000
    ratio = prefetch.metrics["output_tokens_per_s"] / uva.metrics["output_tokens_per_s"]
    assert 1.15 <= ratio <= 2.0, ratio
    # Prompts are compute-bound: prefetch hides the copies there, UVA does not.
    assert prefetch.metrics["ttft_p50_s"] < uva.metrics["ttft_p50_s"]


@pytest.mark.parametrize("gib", [0.5, 1.0, 2.0, 3.5, 7.5, 100.0])
def test_offload_axis_turns_gib_freed_into_valid_flags_and_back(gib: float) -> None:
    shape = LayerShape(80, 0.1992)
    for mode in ("none", "uva", "prefetch"):
        flags = to_flags(mode, gib, shape)
        resolve(flags)  # never an invalid combination
        assert not ("cpu-offload-gb" in flags and "offload-group-size" in flags)
        back_mode, freed = from_flags(flags, shape)
        assert back_mode == mode
        if mode == "uva":
            assert freed == gib
        elif mode == "prefetch":
            most = (80 - 1) * 0.1992
            assert freed >= min(gib, most) - 1e-9
            # The fewest layers that free it: one layer fewer would not.
            assert freed - 0.1992 < gib or freed >= most - 1e-9
