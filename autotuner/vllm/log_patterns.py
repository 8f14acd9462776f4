"""Lines vLLM (0.32) prints when CUDA runs out of memory, as regular expressions.

The engine log classifier (autotuner/engine/classify.py) and the production watcher
(autotuner/watch/oom.py) both read vLLM's words from here.
"""

from __future__ import annotations

import re

# A step's allocation failed (runtime or profiling): the engine core dies with this exception.
TORCH_OOM = r"(torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError): CUDA out of memory\..*"
# The old model runner's sampler warm-up at startup.
SAMPLER_WARMUP_OOM = r"CUDA out of memory occurred when warming up sampler.*"

CUDA_OOM = re.compile(f"{TORCH_OOM}|{SAMPLER_WARMUP_OOM}")
