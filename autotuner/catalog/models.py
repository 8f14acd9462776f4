"""Model shapes: presets and Hugging Face `config.json` directories.

Only the shape matters (bytes to read, FLOPs to do, KV bytes per token); no weights are ever loaded.
The scenario validates engine.model with it, the simulator and the tuner's memory model compute with it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from autotuner.errors import ModelSpecError
from autotuner.filelines import json_line, read_text

# Above any real model's width, depth or vocabulary: a larger number is a typo, and would overflow the
# simulator's byte counts.
MAX_DIMENSION = 1 << 24
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
        # meta-llama/Meta-Llama-3-70B's config.json.
        ModelSpec("llama-3-70b", 8192, 80, 64, 8, 128, 28672, 128256, 8192, dtype="bfloat16"),
        ModelSpec("mistral-7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, dtype="bfloat16"),
        # Qwen3 shapes from their Hugging Face config.json (Qwen/Qwen3-1.7B, -4B, -8B); the published-run
        # table (benchmarks/data/published_runs.yaml) has vLLM measurements of them.
        ModelSpec("qwen3-1.7b", 2048, 28, 16, 8, 128, 6144, 151936, 40960, dtype="bfloat16",
                  tie_word_embeddings=True),
        ModelSpec("qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, 40960, dtype="bfloat16", tie_word_embeddings=True),
        ModelSpec("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 40960, dtype="bfloat16"),
        ModelSpec("qwen3-14b", 5120, 40, 40, 8, 128, 17408, 151936, 40960, dtype="bfloat16"),
        # Qwen2.5 shapes (Qwen/Qwen2.5-3B-Instruct; deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B and -7B, which
        # keep Qwen2.5-Math's shapes with untied embeddings; Qwen/Qwen2.5-14B-Instruct; Qwen/QwQ-32B = Qwen2.5-32B's
        # shape).
        ModelSpec("qwen2.5-1.5b", 1536, 28, 12, 2, 128, 8960, 151936, 131072, dtype="bfloat16"),
        ModelSpec("qwen2.5-3b", 2048, 36, 16, 2, 128, 11008, 151936, 32768, dtype="bfloat16",
                  tie_word_embeddings=True),
        ModelSpec("qwen2.5-7b", 3584, 28, 28, 4, 128, 18944, 152064, 131072, dtype="bfloat16"),
        ModelSpec("qwen2.5-14b", 5120, 48, 40, 8, 128, 13824, 152064, 32768, dtype="bfloat16"),
        ModelSpec("qwq-32b", 5120, 64, 40, 8, 128, 27648, 152064, 40960, dtype="bfloat16"),
    )
}


def weights_per_gpu_gib(name_or_dir: str, tensor_parallel: int) -> float | None:
    """A GPU's share of the weights by the model's shape (a preset or a local config.json), in GiB; None
    for a hub name that cannot be read offline."""
    try:
        model = load_model(name_or_dir)
    except ModelSpecError:
        return None
    return model.weight_bytes / max(1, tensor_parallel) / (1 << 30)


def load_model(name_or_dir: str) -> ModelSpec:
    """A preset name or a directory holding a Hugging Face `config.json`."""
    if name_or_dir in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_dir]
    try:
        path = Path(name_or_dir)
        config = path / "config.json" if path.is_dir() else path
        found = config.is_file()
    except (OSError, ValueError):  # a name no file system accepts (NUL, too long)
        found = False
    if not found:
        raise ModelSpecError(
            f"model {name_or_dir!r} is neither a preset ({', '.join(MODEL_PRESETS)}) "
            "nor a directory holding a config.json"
        )
    text = read_text(config, ModelSpecError, "model config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{config}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise ModelSpecError(f"{config}: not valid JSON: {exc}") from None
    return _from_hf_config(name_or_dir, config, data, text)


def _from_hf_config(name: str, where: Path, data: object, text: str = "") -> ModelSpec:
    if not isinstance(data, dict):
        raise ModelSpecError(f"{where}:1: (top level): expected a JSON object (a Hugging Face config.json)")
    if "text_config" in data:  # multimodal wrappers keep the LM's shape there
        data = data["text_config"]
        if not isinstance(data, dict):
            raise ModelSpecError(f"{_at(where, text, 'text_config')}: text_config: must be an object")

    def fail(key: str, allowed: str, value: object) -> ModelSpecError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ModelSpecError(f"{_at(where, text, key)}: {key}: must be {allowed}, got {shown}")

    def integer(key: str, default: int | None = None) -> int:
        value = data.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < MAX_DIMENSION:
            raise fail(key, f"a positive integer below {MAX_DIMENSION}", value)
        return value

    hidden = integer("hidden_size")
    heads = integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads", heads)
    if hidden // heads == 0 and data.get("head_dim") is None:
        raise fail("num_attention_heads", f"at most hidden_size ({hidden}) unless head_dim is given", heads)
    head_dim = integer("head_dim", hidden // heads)
    dtype = data.get("torch_dtype") or data.get("dtype") or "float16"
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES:
        key = "torch_dtype" if data.get("torch_dtype") else "dtype"
        raise fail(key, f"one of {', '.join(_DTYPE_BYTES)}", dtype)
    rope = data.get("rope_scaling") or {}
    factor = 1.0
    if isinstance(rope, dict) and rope.get("type", rope.get("rope_type")) in ("linear", "dynamic", "yarn"):
        raw = rope.get("factor", 1.0)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 1024:
            raise fail("rope_scaling", "an object whose factor is a number in (0, 1024]", raw)
        factor = float(raw)
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=integer("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=integer("intermediate_size"),
        vocab_size=integer("vocab_size"),
        max_position_embeddings=integer("max_position_embeddings"),
        dtype=dtype,
        tie_word_embeddings=data.get("tie_word_embeddings") is True,
        rope_scaling_factor=factor,
    )


def _at(where: Path, text: str, key: str) -> str:
    line = json_line(text, key) if text else None
    return f"{where}:{line}" if line else str(where)
