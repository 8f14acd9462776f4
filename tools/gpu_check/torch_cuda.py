"""The real device: PyTorch on CUDA, a Llama-shaped model built by transformers with random weights,
the KV-cache tensor, and the check's own layer loop for chunked prefill through SDPA.
"""

from __future__ import annotations

import math
from typing import Any

from tools.gpu_check.device import DeviceOutOfMemoryError
from tools.gpu_check.prefill import Chunk, last_token_rows


class TorchCuda:
    """The real device: PyTorch on CUDA, the model built by transformers with random weights."""

    label = "torch"
    dtype = "bfloat16"

    def __init__(self, index: int) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        torch.zeros(1, device=self.device)  # the CUDA context exists from here on
        self.model: Any = None
        self.kv: Any = None
        self._held: list[Any] = []

    # -- plain allocations (nvml and oom steps)
    def hold(self, nbytes: int) -> None:
        try:
            self._held.append(self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device))
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc

    def release_all(self) -> None:
        self._held.clear()
        self.torch.cuda.empty_cache()

    def free_bytes(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def oom_error_type(self) -> type[BaseException]:
        return self.torch.OutOfMemoryError

    def versions(self) -> dict[str, str]:
        import transformers

        torch = self.torch
        return {"torch": torch.__version__, "cuda": str(torch.version.cuda), "transformers": transformers.__version__,
                "device": torch.cuda.get_device_name(self.device)}

    # -- memory figures (bytes)
    def memory(self) -> tuple[int, int]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        return int(cuda.memory_allocated(self.device)), int(cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> tuple[int, int]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        return int(cuda.max_memory_allocated(self.device)), int(cuda.max_memory_reserved(self.device))

    def empty_cache(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()

    # -- the model
    def load_model(self, spec: Any, layers: int | None) -> int:
        torch = self.torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_hidden_layers=layers or spec.num_layers, num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab_size,
            max_position_embeddings=max(spec.max_position_embeddings, 32768),
            tie_word_embeddings=spec.tie_word_embeddings,
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, self.dtype))
        try:
            with torch.device(self.device):
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.eval().requires_grad_(False)
        self.model = model
        return sum(p.numel() * p.element_size() for p in model.parameters())

    def reserve_kv(self, nbytes: int) -> int:
        """One tensor [layers, 2, kv_heads, tokens, head_dim] of `nbytes` at most; its token capacity."""
        cfg = self.model.config
        per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * self.model.dtype.itemsize
        tokens = max(0, nbytes // per_token)
        try:
            self.kv = self.torch.empty(
                (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, tokens, cfg.head_dim),
                dtype=getattr(self.torch, self.dtype), device=self.device,
            )
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc
        return tokens

    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> Any:
        """Chunked prefill steps through SDPA with one backend: the last step's logits (one row per
        sequence in it); raises DeviceOutOfMemoryError."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[backend]
        logits = None
        try:
            with self.torch.inference_mode(), sdpa_kernel([chosen]):
                for chunks in steps:
                    logits = self._forward(chunks, self.kv if use_kv else None)
            self.synchronize()
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc
        return logits

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    @staticmethod
    def token_ids(torch: Any, chunks: list[Chunk], vocab: int, device: Any) -> Any:
        """Each prompt token's id is a function of its place, so any chunking feeds the same prompts."""
        where = torch.cat([torch.arange(o + s, o + s + n, device=device) for o, s, n in chunks])
        return ((where * 7919 + 13) % vocab).unsqueeze(0)

    def _forward(self, chunks: list[Chunk], kv: Any) -> Any:
        """One engine step: all chunks' tokens through the projections and MLPs together (as vLLM
        batches them), attention per sequence over its cached context (as vLLM's varlen kernel)."""
        torch = self.torch
        import torch.nn.functional as F  # noqa: N812
        from torch.nn.attention.bias import causal_lower_right
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        model = self.model.model
        cfg = self.model.config
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        total = sum(n for _, _, n in chunks)
        ids = self.token_ids(torch, chunks, cfg.vocab_size, self.device)
        pos = torch.cat([torch.arange(s, s + n, device=self.device) for _, s, n in chunks]).unsqueeze(0)
        h = model.embed_tokens(ids)
        # transformers ≥ 4.45 keeps one rotary embedding on the model, older ones one per attention layer
        rotary = getattr(model, "rotary_emb", None) or model.layers[0].self_attn.rotary_emb
        cos, sin = rotary(h, pos)
        for li, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, nh, hd).transpose(1, 2)
            k = attn.k_proj(x).view(1, total, nkv, hd).transpose(1, 2)
            v = attn.v_proj(x).view(1, total, nkv, hd).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs, o = [], 0
            for off, start, n in chunks:
                end = start + n
                if kv is None:  # the profile run: no cache, the chunk attends to itself
                    keys, values = k[:, :, o:o + n], v[:, :, o:o + n]
                else:
                    kv[li, 0, :, off + start:off + end] = k[0, :, o:o + n]
                    kv[li, 1, :, off + start:off + end] = v[0, :, o:o + n]
                    keys, values = kv[li, 0, :, off:off + end][None], kv[li, 1, :, off:off + end][None]
                if nkv != nh:  # the lower-right flash path takes no enable_gqa
                    keys = keys.repeat_interleave(nh // nkv, dim=1)
                    values = values.repeat_interleave(nh // nkv, dim=1)
                query = q[:, :, o:o + n]
                if keys.shape[2] == n:
                    outs.append(F.scaled_dot_product_attention(query, keys, values, is_causal=True))
                else:
                    mask = causal_lower_right(n, keys.shape[2])
                    outs.append(F.scaled_dot_product_attention(query, keys, values, attn_mask=mask))
                o += n
            a = torch.cat(outs, dim=2).transpose(1, 2).reshape(1, total, nh * hd)
            h = h + attn.o_proj(a)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = model.norm(h)
        # The sampler: float32 logits of each sequence's last token, softmax and a sort (top-p).
        last = torch.tensor(list(last_token_rows(chunks)), device=self.device)
        logits = self.model.lm_head(h[0, last]).float()
        torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True)
        return logits

    def attention_agreement(self) -> float:
        """‖flash − math‖ / ‖math‖ for one lower-right causal chunk (1024 new over 3072 context)."""
        torch = self.torch
        import torch.nn.functional as F  # noqa: N812
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        g = torch.Generator(device=self.device).manual_seed(1)
        q = torch.randn(1, 8, 1024, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, 8, 3072, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, 8, 3072, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        out = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):
            with sdpa_kernel([backend]):
                out[name] = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(1024, 3072)).float()
        ref = q.double() @ k.double().transpose(-1, -2) / math.sqrt(128)
        keep = torch.ones(1024, 3072, dtype=torch.bool, device=self.device).tril(3072 - 1024)
        exact = torch.softmax(ref.masked_fill(~keep, float("-inf")), dim=-1) @ v.double()
        err = float((out["flash"].double() - exact).norm() / exact.norm())
        return max(err, float((out["math"].double() - exact).norm() / exact.norm()))
