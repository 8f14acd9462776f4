"""The published-run table is well formed, its ShareGPT-like trace is what the generator writes, and the
simulator's measured error reaches the user (benchmarks/sim_accuracy.py measures it; it never asserts)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from autotuner.catalog.gpus import GPU_PRESETS
from autotuner.catalog.models import MODEL_PRESETS
from autotuner.sim.accuracy import FIGURES, SIM_ACCURACY, inputs_digest, load

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "published_runs.yaml"
ROW_KEYS = {"id", "source", "how_read", "gpu", "gpus", "tp", "model", "dtype", "vllm", "workload", "reported",
            "compare"}


def sim_accuracy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_accuracy", ROOT / "benchmarks" / "sim_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_published_row_says_where_its_figures_come_from() -> None:
    data = yaml.safe_load(DATA.read_text())
    runs = data["runs"]
    assert len(runs) >= 40
    assert sum(r["gpu"] in ("rtx-3090", "rtx-4090") for r in runs) >= 25
    assert len({r["id"] for r in runs}) == len(runs)
    for r in runs:
        assert set(r) >= ROW_KEYS, (r["id"], ROW_KEYS - set(r))
        assert r["source"].startswith("https://"), r["id"]
        assert r["gpu"] in GPU_PRESETS and r["model"] in MODEL_PRESETS, r["id"]
        assert "quant" not in r["dtype"] and r["dtype"] in ("float16", "bfloat16"), r["id"]
        assert set(r["compare"]) <= {"ttft", "tpot", "tput"} and r["compare"], r["id"]
        for metric, key in r["compare"].items():
            assert isinstance(r["reported"][key], int | float), (r["id"], metric)
        assert set(r.get("exclude", {})) <= set(r["compare"]), r["id"]
        assert isinstance(r.get("unreliable", ""), str) and int(r.get("engines", 1)) >= 1, r["id"]
    prompts = [r["workload"].get("prompt_tokens", 0) for r in runs]
    assert min(prompts) <= 256 and max(prompts) >= 2048  # short and long prompts
    concurrency = [r["workload"].get("concurrency") or 0 for r in runs]
    assert min(c for c in concurrency if c) == 1 and max(concurrency) >= 32  # low load and saturation
    for m in data["memory"]:
        assert m["source"].startswith("https://"), m["id"]
        assert m["reported"]["outcome"] in ("ok", "oom", "startup-failed"), m["id"]


def test_shipped_sharegpt_trace_is_the_generators_output() -> None:
    module = sim_accuracy()
    shipped = module.read_trace()
    assert shipped == module.sharegpt_like_lengths()
    prompts = [p for p, _ in shipped]
    outputs = [o for _, o in shipped]
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in shipped)  # benchmark_serving's filter
    # The filter trims the long tail, so the means land a little under the paper's 161.31 / 337.99.
    assert 0.85 * module.SHAREGPT_MEAN_INPUT <= statistics.mean(prompts) <= module.SHAREGPT_MEAN_INPUT
    assert 0.80 * module.SHAREGPT_MEAN_OUTPUT <= statistics.mean(outputs) <= module.SHAREGPT_MEAN_OUTPUT


def test_sim_evaluate_quotes_the_measured_error() -> None:
    argv = [sys.executable, "-m", "autotuner.sim", "evaluate", "llama-2-7b", "--prompts", "2", "--prompt-tokens",
            "100-200", "--output-tokens", "8"]
    data = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True).stdout)
    assert data["accuracy"] == SIM_ACCURACY.quote()
    assert f"TTFT ±{SIM_ACCURACY.ttft_pct:.0f} %" in data["accuracy"] and "published runs" in data["accuracy"]
    text = subprocess.run(argv, capture_output=True, text=True, check=True, env={"COLUMNS": "200", "PATH": "/usr/bin"})
    assert "published runs" in text.stdout


def test_quoted_figures_are_measured_from_the_current_rows_and_simulator() -> None:
    """The figures users are quoted come from benchmarks/sim_accuracy.py's last run over the rows and the
    simulator as they are now: any change to published_runs.yaml or to the simulator's performance sources
    since then fails here until the script runs again (it rewrites autotuner/sim/accuracy_figures.json)."""
    stored = load(FIGURES)
    assert stored.digest == inputs_digest(DATA.read_bytes()), (
        "autotuner/sim/accuracy_figures.json is stale: run .venv/bin/python benchmarks/sim_accuracy.py")
    runs = yaml.safe_load(DATA.read_text())["runs"]
    assert stored.runs == len(runs)
    assert set(stored.classes) >= {"all", "rtx-3090", "rtx-4090", "datacenter"}
    quote = stored.quote()
    for name in ("RTX 3090", "RTX 4090", "datacenter"):
        assert f"{name}: " in quote
    worst = stored.classes["rtx-3090"]["tput"]
    assert worst.worst_row in {r["id"] for r in runs}
    assert f"worst {worst.worst_pct:+.0f} % at {worst.worst_row}" in quote


def test_a_changed_row_makes_the_figures_stale() -> None:
    raw = DATA.read_bytes()
    assert inputs_digest(raw) != inputs_digest(raw.replace(b"req_s: 2.40", b"req_s: 2.41", 1))
