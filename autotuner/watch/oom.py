"""CUDA out-of-memory lines in a production vLLM's log."""

from __future__ import annotations

from autotuner.vllm.log_patterns import CUDA_OOM


def oom_lines(log_text: str) -> list[str]:
    """Each log line that reports a CUDA OOM, stripped, in log order."""
    return [line.strip() for line in log_text.splitlines() if CUDA_OOM.search(line)]
