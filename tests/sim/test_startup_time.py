"""A simulated `vllm serve` comes up in the field reports' minutes, and the host's caches make the next
start faster (sim/startup_time.py): page cache, compile cache, P2P cache, each with its own key."""

from __future__ import annotations

from pathlib import Path

from autotuner.sim.args import EngineConfig, build_config, parse_args
from autotuner.sim.startup_time import StartupCaches, lookup_and_remember, phases

ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def config(*argv: str) -> EngineConfig:
    return build_config(parse_args(list(argv)), ENV)


def seconds(cfg: EngineConfig, caches: StartupCaches) -> dict[str, float]:
    tp = cfg.tensor_parallel_size
    return {p.name: p.seconds for p in phases(cfg, caches, cfg.model.weight_bytes // tp)}


SEED = ("llama-2-13b", "--sim-gpu", "rtx-3090", "--sim-gpus", "8", "-tp", "8", "--max-model-len", "8192")
COLD = StartupCaches(p2p=False, weights=False, compile=False)
WARM = StartupCaches(p2p=True, weights=True, compile=True)


def test_13b_at_tp8_on_3090s_starts_in_the_reported_minutes() -> None:
    cold, warm = seconds(config(*SEED), COLD), seconds(config(*SEED), WARM)
    # Reports: 90–180 s warm (anchors); the cold start pays torch.compile and a disk read on top.
    assert 80 <= sum(warm.values()) <= 180
    assert sum(cold.values()) > sum(warm.values()) + 60
    assert cold["compile"] > 5 * warm["compile"] and cold["load"] > warm["load"]
    assert warm["graphs"] == cold["graphs"]  # CUDA graphs are captured at every start
    # More than two PCIe-only GPUs: vLLM disables the custom all-reduce before its P2P check.
    assert "p2p-check" not in cold


def test_the_p2p_check_runs_where_the_custom_all_reduce_can_and_is_cached() -> None:
    two = config("llama-3-8b", "--sim-gpu", "rtx-3090", "--sim-gpus", "2", "-tp", "2")
    nvlink8 = config("llama-2-70b", "--sim-gpu", "a100-80gb", "--sim-gpus", "8", "-tp", "8")
    assert 0 < seconds(two, COLD)["p2p-check"] < seconds(nvlink8, COLD)["p2p-check"]
    assert seconds(nvlink8, WARM)["p2p-check"] == 0
    assert "p2p-check" not in seconds(config("llama-3-8b", "--sim-gpu", "rtx-3090"), COLD)


def test_a_second_start_finds_what_the_first_left_and_a_new_tp_size_recompiles(tmp_path: Path) -> None:
    first = lookup_and_remember(tmp_path, config(*SEED))
    assert first == COLD
    assert lookup_and_remember(tmp_path, config(*SEED)) == WARM
    assert lookup_and_remember(tmp_path, config(*SEED, "--max-num-batched-tokens", "4096")) == WARM
    tp4 = lookup_and_remember(tmp_path, config("llama-2-13b", "--sim-gpu", "rtx-3090", "--sim-gpus", "8", "-tp", "4",
                                               "--max-model-len", "8192"))
    assert tp4 == StartupCaches(p2p=False, weights=True, compile=False)
    other_model = lookup_and_remember(tmp_path, config("llama-2-7b", "--sim-gpu", "rtx-3090", "--sim-gpus", "8",
                                                       "-tp", "8"))
    assert other_model == StartupCaches(p2p=True, weights=False, compile=False)
