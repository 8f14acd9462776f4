"""autotuner: closed-loop tuning of vLLM serving flags against runtime OOM."""

__version__ = "0.1.0"
