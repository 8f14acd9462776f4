"""One module of vLLM knowledge: the tuner's pre-launch check and the simulator's startup validation
are the same rules, with the same defaults, on every GPU; flag values are typed as vLLM types them."""

from __future__ import annotations

import itertools

import pytest

from autotuner.catalog.gpus import GPU_PRESETS
from autotuner.engine import classify
from autotuner.engine.launch import parse_set
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.sim.args import VllmArgError, build_config, parse_args
from autotuner.trials.outcomes import Outcome
from autotuner.tuner.space import FlagRules, platform_of
from autotuner.vllm import FlagTypeError, Platform, human_readable_int, is_known, knowledge_for, series_of

GPUS = sorted(GPU_PRESETS)
ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def tuner_rules(gpu: str, model: str = "llama-2-13b", gpus: int = 8) -> FlagRules:
    spec = GPU_PRESETS[gpu]
    scenario = Scenario.model_validate({"engine": {"kind": "sim", "model": model, "env": ENV,
                                                   "sim": {"gpu": gpu, "gpus": gpus}}})
    # The inventory the study key records for the simulated box.
    inventory = [f"{spec.product_name} ({spec.memory_gib} GiB, simulated)"] * gpus
    return FlagRules(scenario, inventory, "0.32.0 (simulated)")


def sim_verdict(gpu: str, flags: dict[str, object], model: str = "llama-2-13b", gpus: int = 8) -> str | None:
    """What the simulator says at startup, read back the way the trial's log classifier reads it."""
    argv = [model, "--sim-gpu", gpu, "--sim-gpus", str(gpus)]
    for name, value in flags.items():
        argv += [f"--{name}"] if value is True else [f"--no-{name}"] if value is False else [f"--{name}", str(value)]
    try:
        build_config(parse_args(argv), ENV)
    except VllmArgError as exc:
        assert exc.exit_code == 1
        facts = classify.classify(exc.message.splitlines())
        assert facts.failure == Outcome.INVALID_FLAGS and facts.reason, exc.message
        return facts.reason
    return None


GRID = [
    dict(zip(("max-num-batched-tokens", "max-num-seqs", "enable-chunked-prefill", "max-model-len",
              "tensor-parallel-size", "gpu-memory-utilization"), values, strict=True))
    for values in itertools.product((None, 64, 2048, 6000, 16384), (None, 128, 512, 4096), (None, False),
                                    (None, 8192), (None, 8, 3), (None, 1.2))
]


@pytest.mark.parametrize("gpu", GPUS)
def test_tuner_and_simulator_agree_on_every_combination(gpu: str) -> None:
    rules = tuner_rules(gpu)
    disagreements = []
    rejected = 0
    for combo in GRID:
        flags = {k: v for k, v in combo.items() if v is not None}
        tuner = rules.violation(flags)
        sim = sim_verdict(gpu, flags)
        rejected += sim is not None
        # Same verdict, and the tuner's reason holds what the trial would have read from the engine's log.
        if (tuner is None) != (sim is None) or (sim is not None and sim not in (tuner or "")):
            disagreements.append((flags, tuner, sim))
    assert not disagreements, disagreements[:3]
    assert 0 < rejected < len(GRID)  # the grid exercises both verdicts


def test_defaults_agree_and_depend_on_the_gpu() -> None:
    budgets = {}
    for gpu in GPUS:
        config = build_config(parse_args(["llama-3-8b", "--sim-gpu", gpu]), ENV)
        defaults = tuner_rules(gpu, "llama-3-8b", 1).defaults()
        assert (defaults["max-num-batched-tokens"], defaults["max-num-seqs"]) == \
            (config.max_num_batched_tokens, config.max_num_seqs)
        assert defaults["gpu-memory-utilization"] == config.gpu_memory_utilization
        assert defaults["cpu-offload-gb"] == config.cpu_offload_gb
        budgets[gpu] = defaults["max-num-batched-tokens"]
    expected = {"a100-80gb": 2048, "h100-80gb": 8192, "rtx-3090": 2048, "rtx-4090": 2048}
    assert {gpu: budgets[gpu] for gpu in expected} == expected
    assert knowledge_for("0.32.0").scheduler_defaults(Platform("NVIDIA H200", 140.0)) == (8192, 1024)
    assert knowledge_for("0.32.0").scheduler_defaults(Platform("NVIDIA B200", 180.0)) == (16384, 1024)


def test_a_valid_candidate_on_a_large_gpu_is_not_rejected() -> None:
    """The old tuner assumed a 2048-token default budget everywhere: max-num-seqs 4096 with the budget
    unset was rejected without a launch on an H100, where vLLM's default budget is 8192."""
    flags = {"max-num-seqs": 4096, "enable-chunked-prefill": False, "max-model-len": 8192}
    assert tuner_rules("h100-80gb", "llama-3-8b", 1).violation(flags) is None
    assert sim_verdict("h100-80gb", flags, "llama-3-8b", 1) is None
    assert tuner_rules("rtx-3090", "llama-3-8b", 1).violation({"max-num-seqs": 4096}) is not None


def test_cpu_defaults_scale_with_the_world_size() -> None:
    """vllm/engine/arg_utils.py get_batch_defaults: the CPU backend's 2048 / 128 are per rank."""
    cpu = Platform("cpu", 0.0)
    assert knowledge_for("0.32.0").scheduler_defaults(cpu) == (2048, 128)
    assert knowledge_for("0.32.0").scheduler_defaults(cpu, world_size=4) == (8192, 512)
    assert knowledge_for("0.32.0").violation({"max-num-seqs": 4096, "tensor-parallel-size": 2}, cpu) is None
    assert knowledge_for("0.32.0").violation({"max-num-seqs": 4097, "tensor-parallel-size": 2}, cpu) is not None


def test_platform_from_the_study_inventory() -> None:
    assert platform_of(["NVIDIA H100 80GB HBM3 (79.65 GiB)"] * 2) == Platform("NVIDIA H100 80GB HBM3", 79.65, 2)
    assert platform_of(["engine process tree RSS (62.00 GiB)", "host RAM used (62.00 GiB)"]).is_cpu
    assert platform_of([]) is None


@pytest.mark.parametrize(("text", "value"), [("8192", 8192), ("8k", 8000), ("8K", 8192), ("25.6k", 25600),
                                              ("4M", 4 << 20), ("1G", 1 << 30)])
def test_human_readable_ints_like_vllm(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_set_values_are_typed_before_any_launch() -> None:
    assert parse_set(["max-num-batched-tokens=2k", "gpu-memory-utilization=0.9", "enforce-eager=true",
                      "some-new-flag=x"]) == {"max-num-batched-tokens": 2000, "gpu-memory-utilization": 0.9,
                                              "enforce-eager": True, "some-new-flag": "x"}
    with pytest.raises(FlagTypeError, match=r"--set max-num-batched-tokens=abc: 'abc' is not a valid value for "
                       r"--max-num-batched-tokens: expected an integer"):
        parse_set(["max-num-batched-tokens=abc"])
    with pytest.raises(FlagTypeError, match="expected true or false"):
        parse_set(["enable-chunked-prefill=maybe"])
    with pytest.raises(FlagTypeError, match="one of auto, float16, bfloat16, fp8"):
        parse_set(["kv-cache-dtype=int3"])
    with pytest.raises(UserInputError, match="set by the tuner"):
        parse_set(["port=1234"])


def test_the_simulator_parses_flags_with_the_same_types() -> None:
    ns = parse_args(["llama-2-7b", "--max-model-len", "2K", "--no-enforce-eager"])
    assert ns.max_model_len == 2048 and ns.enforce_eager is False
    auto = build_config(parse_args(["llama-2-7b", "--max-model-len", "auto"]), ENV)
    assert auto.max_model_len == 4096  # the model's own
    assert parse_set(["max-model-len=auto"]) == {"max-model-len": "auto"}
    with pytest.raises(VllmArgError) as err:
        parse_args(["llama-2-7b", "--max-num-batched-tokens", "abc"])
    assert err.value.exit_code == 2


def test_versions() -> None:
    assert series_of("0.32.0") == "0.32" and series_of("v0.33.1rc1") == "0.33" and series_of("banana") is None
    assert is_known("0.32.0+cpu") and not is_known("0.9.2") and not is_known(None)
    assert knowledge_for("0.9.2").series == knowledge_for(None).series  # the newest known
