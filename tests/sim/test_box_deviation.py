"""A GPU description file can make a box deviate from its preset (catalog.gpus.BoxDeviation): each
field moves what the simulator computes the way it says, and a file without them is the preset."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotuner.catalog.gpus import GPU_PRESETS, load_gpu
from autotuner.errors import HardwareSpecError
from autotuner.sim.args import build_config, parse_args
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, evaluate

PRESET = {"name": "box", "product_name": "NVIDIA GeForce RTX 4090", "memory_gib": 23.99, "bandwidth_gbps": 1008.0,
          "fp16_tflops": 165.0, "pcie_gbps": 24.0, "nvlink_gbps": 0.0}


def _box(tmp_path: Path, **deviation: object) -> str:
    path = tmp_path / f"box-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump({**PRESET, **deviation}))
    return str(path)


def _run(gpu: str, budget: int = 2048, prompts: tuple[int, int] = (1500, 2500)) -> Evaluation:
    config = build_config(parse_args(["llama-3-8b", "--sim-gpu", gpu, "--max-model-len", "4096",
                                      "--max-num-batched-tokens", str(budget), "--gpu-memory-utilization", "0.8",
                                      "--sim-noise", "0"]), {})
    return evaluate(config, SyntheticWorkload(prompts=12, prompt_tokens=prompts, output_tokens=64,
                                              concurrency=4).requests(config.model.vocab_size), 4)


def test_a_file_without_deviation_is_its_preset(tmp_path: Path) -> None:
    plain, preset = _run(_box(tmp_path)), _run("rtx-4090")
    assert plain.outcome == "ok" and plain.metrics == preset.metrics and plain.memory == preset.memory
    assert load_gpu(_box(tmp_path)).preset == GPU_PRESETS["rtx-4090"]


def test_each_field_moves_what_it_says(tmp_path: Path) -> None:
    base = _run(_box(tmp_path))
    slow_compute = _run(_box(tmp_path, compute_efficiency=0.5))
    assert slow_compute.metrics["ttft_p50_s"] > 1.5 * base.metrics["ttft_p50_s"]  # prefill is compute-bound
    slow_memory = _run(_box(tmp_path, bandwidth_efficiency=0.7))
    assert slow_memory.metrics["tpot_p50_s"] > 1.2 * base.metrics["tpot_p50_s"]  # decode streams weights
    overhead = _run(_box(tmp_path, step_overhead_s=0.010))
    assert overhead.metrics["tpot_p50_s"] > base.metrics["tpot_p50_s"] + 0.007
    more_non_torch = _run(_box(tmp_path, non_torch_gib=1.0))
    kv_bytes = (base.kv_cache_tokens - more_non_torch.kv_cache_tokens) * (128 * 1024)  # llama-3-8b, fp16
    assert kv_bytes == pytest.approx(2**30, rel=0.01)
    big_transient = _run(_box(tmp_path, transient_scale=2.0))
    assert big_transient.kv_cache_tokens == base.kv_cache_tokens  # the profile never saw it
    assert max(big_transient.memory["peak_bytes"]) > max(base.memory["peak_bytes"]) + 2**30


def test_an_efficiency_table_shapes_compute_by_step_tokens(tmp_path: Path) -> None:
    """Slow only at large steps: a long prefill suffers, batch-4 decode does not."""
    table = _box(tmp_path, efficiency_by_tokens=[[64, 1.0], [1024, 1.0], [4096, 0.4]])
    base, shaped = _run(_box(tmp_path), budget=4096), _run(table, budget=4096)
    assert shaped.metrics["ttft_p50_s"] > 1.5 * base.metrics["ttft_p50_s"]
    assert shaped.metrics["tpot_p50_s"] == pytest.approx(base.metrics["tpot_p50_s"], rel=0.05)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("efficiency_by_tokens", [[512, 1.0], [16, 0.8]], "strictly ascending"),
    ("efficiency_by_tokens", [[16, 0.0]], "greater than 0"),
    ("compute_efficiency", "fast", "must be a number"),
    ("transient_scale", -1, "greater than or equal to 0"),
])
def test_a_bad_deviation_is_refused_with_its_line(tmp_path: Path, field: str, value: object, says: str) -> None:
    with pytest.raises(HardwareSpecError) as exc:
        load_gpu(_box(tmp_path, **{field: value}))
    assert field in str(exc.value) and says in str(exc.value)
