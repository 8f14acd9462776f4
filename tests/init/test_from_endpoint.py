"""Acceptance (issue 12, item 7): `autotuner init --from-endpoint` against a real simulator process that
served traffic with a known prompt-length distribution writes a scenario whose lengths match it.

Tolerance: vLLM buckets lengths at 1-2-5 bounds, so the endpoint can only say which bucket a request
fell in. The fitted distribution's quantiles must land within a quarter of the width of the bucket
holding the traffic's own quantile (e.g. ±250 tokens for a p50 in 1000-2000) — a quarter of what the
histogram itself can resolve there.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from autotuner.daemon.config import load_config
from autotuner.scenario import LengthSettings, load_scenario
from autotuner.vllm import Platform, scheduler_defaults
from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch import gpu_inventory
from autotuner.watch.drift import length_quantile
from autotuner.workload.client import StreamingClient, http_client
from autotuner.workload.replay import replay
from autotuner.workload.requests import build_requests
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec

MAX_LEN = 16384
SIM = ["llama-2-13b", "-tp", "8", "--max-model-len", str(MAX_LEN), "--sim-speedup", "100",
       "--served-model-name", "prod"]
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def init(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "init", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def bucket_width(value: float) -> float:
    lower = 0
    for le in build_1_2_5_buckets(MAX_LEN):
        if value <= le:
            return le - lower
        lower = le
    raise AssertionError(f"{value} is above the top bucket")


async def test_init_from_endpoint_reproduces_the_traffic_lengths(sim_server, tmp_path: Path) -> None:
    server = sim_server.start(SIM)
    sent_dist = LengthDist("lognormal", median=1500, sigma=0.6, max=12000)
    spec = WorkloadSpec(SyntheticRequests(240, sent_dist, LengthDist("fixed", value=16)),
                        Arrivals("concurrency", concurrency=16, time_scale=100), seed=5)
    async with http_client() as http:
        built = await build_requests(spec, http, server.url, "prod")
        result = await replay(spec, built.requests, StreamingClient(http, server.url, "prod"))
    assert all(r.ok for r in result.results), [r.error for r in result.results if not r.ok][:3]
    sent = sorted(r.prompt_tokens or 0 for r in result.results)
    assert len(sent) == 240

    out = tmp_path / "cfg"
    done = init("--from-endpoint", server.url, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "prompt lengths from vllm:request_prompt_tokens: 240 requests" in done.stdout
    gpus = gpu_inventory()  # on this test's simulated host: the simulator's 8 GPUs, through its NVML
    assert gpus and f"GPUs (NVML): {len(gpus)} × " in done.stdout
    scenario = yaml.safe_load((out / "scenario.yaml").read_text())
    assert load_scenario(out / "scenario.yaml").engine.kind == "sim"  # the simulator said so in /version
    assert scenario["engine"]["sim"] == {"gpu": "rtx-3090", "gpus": 8, "speedup": 100.0}
    assert scenario["engine"]["model"] == "llama-2-13b"
    assert scenario["engine"]["served_model_name"] == "prod"
    assert scenario["engine"]["flags"]["max-model-len"] == MAX_LEN
    requests = scenario["workload"]["requests"]
    assert requests["output_tokens"] == {"kind": "fixed", "value": 16}  # one bucket: the exact mean
    prompt = LengthSettings.model_validate(requests["prompt_tokens"])
    assert prompt.kind == "lognormal"
    assert prompt.max is not None and prompt.max + 16 <= MAX_LEN

    cuts = statistics.quantiles(sent, n=100, method="inclusive")
    for q in QUANTILES:
        observed = cuts[round(q * 100) - 1]
        fitted = length_quantile(prompt, q)
        tolerance = bucket_width(observed) / 4
        assert abs(fitted - observed) <= tolerance, (q, fitted, observed, tolerance, prompt)
        print(f"p{round(q * 100)}: sent {observed:.0f}, fitted {fitted:.0f}, tolerance ±{tolerance:.0f}")
    fitted_dist = LengthDist("lognormal", median=prompt.median, sigma=prompt.sigma, min=prompt.min, max=prompt.max)
    rng = random.Random(1)
    mean_fitted = statistics.fmean(fitted_dist.sample(rng) for _ in range(20000))
    assert abs(mean_fitted - statistics.fmean(sent)) / statistics.fmean(sent) < 0.1


def test_command_line_and_endpoint_combined_with_an_api_key(sim_server, tmp_path: Path) -> None:
    key = "prod-key-31415926"
    server = sim_server.start([*SIM[:4], "4096", *SIM[5:], "--api-key", key])
    cmd = f"vllm serve llama-2-13b -tp 8 --max-model-len 4096 --api-key {key} --served-model-name prod"
    denied = init("--from-cmd", cmd, "--from-endpoint", server.url, "--out", str(tmp_path / "a"))
    assert denied.returncode == 2 and "401" in denied.stderr and "--api-key-env" in denied.stderr
    assert not (tmp_path / "a").exists()

    done = init("--from-cmd", cmd, "--from-endpoint", server.url, "--api-key-env", "PROD_KEY",
                "--out", str(tmp_path / "b"), env={"PROD_KEY": key})
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "b" / "scenario.yaml").read_text() + (tmp_path / "b" / "autotuner-daemon.yaml").read_text()
    assert key not in text and key not in done.stdout
    scenario = yaml.safe_load((tmp_path / "b" / "scenario.yaml").read_text())
    assert scenario["engine"]["api_key_env"] == "PROD_KEY"
    assert scenario["engine"]["flags"] == {"tensor-parallel-size": 8, "max-model-len": 4096}
    # Not on the command line: vLLM's default for the GPU NVML shows (the simulated RTX 3090: 2048).
    gpu = gpu_inventory()[0]
    expected = scheduler_defaults(Platform(gpu.name, gpu.memory_total_mib / 1024))[0]
    assert scenario["current_config"]["max-num-batched-tokens"] == expected
    # No traffic yet: the lengths stay the defaults, and the user is told why.
    assert "prompt_tokens" not in scenario["workload"]["requests"]
    assert "has 0 requests" in done.stdout
    daemon = yaml.safe_load((tmp_path / "b" / "autotuner-daemon.yaml").read_text())
    assert daemon["production"] == {"endpoint": server.url, "api_key_env": "PROD_KEY"}
    loaded = load_config(tmp_path / "b" / "autotuner-daemon.yaml")  # what `autotuner daemon run` reads
    assert loaded.config.production.api_key_env == "PROD_KEY"
