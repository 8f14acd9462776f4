"""The simulator's command line: vLLM's flags, defaults, messages and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.catalog.gpus import load_gpu
from autotuner.catalog.models import load_model
from autotuner.errors import HardwareSpecError
from autotuner.sim.args import VllmArgError, build_config, parse_args

ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def config(*argv: str, env: dict[str, str] | None = None):
    return build_config(parse_args(list(argv)), ENV if env is None else env)


def test_defaults_follow_vllm_for_24gb_cards() -> None:
    c = config("llama-2-13b", "-tp", "8", "--max-model-len", "8192")
    assert (c.max_num_batched_tokens, c.max_num_seqs) == (2048, 256)
    assert c.gpu_memory_utilization == 0.92
    assert c.enable_chunked_prefill and c.enable_prefix_caching
    assert c.gpu_indices == tuple(range(8))
    assert c.served_model_names == ("llama-2-13b",)


def test_defaults_for_h100_and_unchunked_budget() -> None:
    c = config("llama-3-8b", "--sim-gpu", "h100-80gb")
    assert (c.max_num_batched_tokens, c.max_num_seqs) == (8192, 1024)
    a100 = config("llama-3-8b", "--sim-gpu", "a100-80gb")
    assert a100.max_num_batched_tokens == 2048
    unchunked = config("llama-2-13b", "-tp", "8", "--max-model-len", "8192", "--no-enable-chunked-prefill")
    assert unchunked.max_num_batched_tokens == 8192


def test_unknown_flag_exits_2_like_vllm() -> None:
    with pytest.raises(VllmArgError) as err:
        parse_args(["llama-2-7b", "--foo-bar", "1"])
    assert err.value.exit_code == 2
    assert "error: unrecognized arguments: --foo-bar 1" in err.value.message


def test_unparsable_value_exits_2() -> None:
    with pytest.raises(VllmArgError) as err:
        parse_args(["llama-2-7b", "--max-num-seqs", "many"])
    assert err.value.exit_code == 2
    assert "invalid int value: 'many'" in err.value.message


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--max-num-batched-tokens", "64", "--max-num-seqs", "128"],
         "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."),
        (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "1024", "--max-model-len", "4096"],
         "max_num_batched_tokens (1024) is smaller than max_model_len (4096)."),
        (["--gpu-memory-utilization", "1.5"], "Input should be less than or equal to 1"),
        (["--gpu-memory-utilization", "0"], "Input should be greater than 0"),
        (["-tp", "3"], "must be divisible by tensor parallel size (3)"),
        (["-tp", "4", "--sim-gpus", "2"], "World size (4) is larger than the number of available GPUs (2)"),
        (["--block-size", "0"], "Input should be greater than 0"),  # 0.32 takes any positive size
    ],
)
def test_invalid_values_exit_1_with_vllm_messages(argv: list[str], text: str) -> None:
    with pytest.raises(VllmArgError) as err:
        config("llama-2-7b", *argv)
    assert err.value.exit_code == 1
    assert text in err.value.message


def test_max_model_len_beyond_model_needs_vllm_override() -> None:
    with pytest.raises(VllmArgError) as err:
        config("llama-2-13b", "--max-model-len", "8192", env={})
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in err.value.message
    assert config("llama-2-13b", "--max-model-len", "8192").max_model_len == 8192


def test_config_file_then_command_line_wins(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("max_num_batched_tokens: 1024\nenable-prefix-caching: false\ngpu-memory-utilization: 0.8\n")
    c = config("llama-2-7b", "--config", str(f), "--gpu-memory-utilization", "0.85")
    assert c.max_num_batched_tokens == 1024
    assert c.enable_prefix_caching is False
    assert c.gpu_memory_utilization == 0.85


def test_cuda_visible_devices_picks_gpus() -> None:
    c = config("llama-2-7b", "-tp", "2", "--sim-gpus", "8", env={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert c.gpu_indices == (4, 5)


def test_model_from_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, '
        '"num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936, '
        '"max_position_embeddings": 32768, "torch_dtype": "bfloat16", "tie_word_embeddings": true}'
    )
    m = load_model(str(tmp_path))
    assert (m.head_dim, m.num_kv_heads, m.dtype_bytes) == (128, 2, 2)
    assert m.kv_bytes_per_token(1) == 2 * 24 * 2 * 128 * 2
    assert 2.15e9 < m.num_params < 2.17e9  # 24 × 77.1M per layer + 311M tied embedding
    c = config(str(tmp_path), "--max-model-len", "4096")
    assert c.model.hidden_size == 2048


def test_bad_model_config_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 0}')
    with pytest.raises(VllmArgError) as err:
        config(str(tmp_path))
    assert "config.json:1: hidden_size: must be a positive integer" in err.value.message


def test_gpu_file(tmp_path: Path) -> None:
    f = tmp_path / "gpu.yaml"
    f.write_text("name: rtx-5090\nmemory_gib: 31.36\nbandwidth_gbps: 1792\nfp16_tflops: 209\n"
                 "pcie_gbps: 50\nnvlink_gbps: 0\n")
    g = load_gpu(str(f))
    assert g.memory_bytes == int(31.36 * (1 << 30)) and g.link_gbps == 50
    f.write_text("name: x\nmemory_gib: 24\n")
    with pytest.raises(HardwareSpecError, match=r"gpu.yaml:1: bandwidth_gbps: is required"):
        load_gpu(str(f))
    with pytest.raises(HardwareSpecError, match="neither a GPU preset"):
        load_gpu("rtx-9999")
