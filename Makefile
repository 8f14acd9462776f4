# One command per job. `make quickstart` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: quickstart test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The main job: the seed's long-prompt case on the simulated 8x RTX 3090 box.
quickstart: $(VENV)/.installed
	VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 $(BIN)/autotuner sim evaluate llama-2-13b --tensor-parallel-size 8 \
	  --max-model-len 8192 --sim-gpu rtx-3090 --prompts 8 --prompt-tokens 3000-6000 --output-tokens 256 \
	  --concurrency 8 --gpu-memory-utilization 0.80 --no-enable-chunked-prefill
	VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 $(BIN)/autotuner sim evaluate llama-2-13b --tensor-parallel-size 8 \
	  --max-model-len 8192 --sim-gpu rtx-3090 --prompts 8 --prompt-tokens 3000-6000 --output-tokens 256 \
	  --concurrency 8 --gpu-memory-utilization 0.80 --max-num-batched-tokens 1024

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# Every test, real engines included.
test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/sim_speed.py
	$(BIN)/python benchmarks/sim_timing_fidelity.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
