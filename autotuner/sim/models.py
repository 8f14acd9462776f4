"""Model shapes for the simulator: presets and Hugging Face `config.json` directories.

Only the shape matters to the simulator (bytes to read, FLOPs to do, KV bytes per token); no weights
are ever loaded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from autotuner.errors import ModelSpecError

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "float16"
    tie_word_embeddings: bool = False
    rope_scaling_factor: float = 1.0

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q + kv + o + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * self.params_per_layer + embed + head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def lm_head_params(self) -> int:
        """The output projection: run only for the rows being sampled, read in full every step."""
        return self.vocab_size * self.hidden_size

    @property
    def streamed_bytes(self) -> int:
        """Weights a forward pass reads: all but an untied input embedding, of which it gathers a few rows."""
        untied_embedding = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (self.num_params - untied_embedding) * self.dtype_bytes

    @property
    def token_params(self) -> int:
        """Parameters every token's forward pass multiplies with (the decoder layers)."""
        return self.num_layers * self.params_per_layer

    @property
    def derived_max_model_len(self) -> int:
        return int(self.max_position_embeddings * self.rope_scaling_factor)

    def kv_bytes_per_token(self, tp: int) -> int:
        """KV cache bytes one token takes on one GPU (vLLM replicates KV heads when kv_heads < TP)."""
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * self.dtype_bytes

    def fingerprint(self) -> str:
        """Stable digest of the shape: two directories with the same config.json tune alike."""
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "name"}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 4096, 32, 32, 32, 128, 11008, 32000, 4096),
        ModelSpec("llama-2-13b", 5120, 40, 40, 40, 128, 13824, 32000, 4096),
        ModelSpec("llama-3-8b", 4096, 32, 32, 8, 128, 14336, 128256, 8192, dtype="bfloat16"),
        ModelSpec("llama-2-70b", 8192, 80, 64, 8, 128, 28672, 32000, 4096),
        ModelSpec("mistral-7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, dtype="bfloat16"),
        # Qwen3 shapes from their Hugging Face config.json (Qwen/Qwen3-1.7B, -4B, -8B); the published-run
        # table (benchmarks/data/published_runs.yaml) has vLLM measurements of them.
        ModelSpec("qwen3-1.7b", 2048, 28, 16, 8, 128, 6144, 151936, 40960, dtype="bfloat16",
                  tie_word_embeddings=True),
        ModelSpec("qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, 40960, dtype="bfloat16", tie_word_embeddings=True),
        ModelSpec("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 40960, dtype="bfloat16"),
    )
}


def load_model(name_or_dir: str) -> ModelSpec:
    """A preset name or a directory holding a Hugging Face `config.json`."""
    if name_or_dir in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_dir]
    path = Path(name_or_dir)
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        raise ModelSpecError(
            f"model {name_or_dir!r} is neither a preset ({', '.join(MODEL_PRESETS)}) "
            "nor a directory holding a config.json"
        )
    try:
        data = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSpecError(f"{config}: cannot read model config: {exc}") from exc
    return _from_hf_config(name_or_dir, config, data)


def _from_hf_config(name: str, where: Path, data: object) -> ModelSpec:
    if not isinstance(data, dict):
        raise ModelSpecError(f"{where}: expected a JSON object")
    data = data.get("text_config", data)  # multimodal wrappers keep the LM's shape there

    def need(key: str) -> int:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelSpecError(f"{where}: {key} must be a positive integer, got {value!r}")
        return value

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    kv_heads = data.get("num_key_value_heads") or heads
    head_dim = data.get("head_dim") or hidden // heads
    dtype = str(data.get("torch_dtype") or data.get("dtype") or "float16")
    if dtype not in _DTYPE_BYTES:
        raise ModelSpecError(f"{where}: torch_dtype {dtype!r} is not one of {', '.join(_DTYPE_BYTES)}")
    rope = data.get("rope_scaling") or {}
    factor = 1.0
    if isinstance(rope, dict) and rope.get("type", rope.get("rope_type")) in ("linear", "dynamic", "yarn"):
        factor = float(rope.get("factor", 1.0))
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=need("intermediate_size"),
        vocab_size=need("vocab_size"),
        max_position_embeddings=need("max_position_embeddings"),
        dtype=dtype,
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        rope_scaling_factor=factor,
    )
