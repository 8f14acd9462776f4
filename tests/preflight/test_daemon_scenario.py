"""`autotuner doctor` on the daemon's scenario (issue 22, item 10): vLLM's own startup rules on the
scenario's flags — a context longer than the model's without VLLM_ALLOW_LONG_MAX_MODEL_LEN, a TP that
cannot hold the model, a world size above the GPUs — and a GPU row that shows the GPUs the monitor
will use. The endpoint is a real simulator process; the rest runs in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autotuner.catalog.gpus import load_gpu
from autotuner.cli.prepare import plan_lines
from autotuner.daemon.config import load_config
from autotuner.init import run_init
from autotuner.preflight import run_checks
from autotuner.preflight.machine_checks import check_gpus
from autotuner.scenario import load_scenario
from autotuner.sim.gpu_state import GpuHost, make_gpus
from autotuner.vllm.rules import LONG_MAX_MODEL_LEN_VAR, derived_max_model_len

LONG = 8192  # llama-2-7b's own context is 4096


def by_name(report: object, name: str) -> object:
    return next(c for c in report.checks if c.name == name)  # type: ignore[attr-defined]


def write(tmp_path: Path, data: dict[str, object], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_scenario_init_writes_from_an_endpoint_fails_doctor_with_the_context_reason(
        sim_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Production: llama-2-7b at twice its context, allowed by the variable in production's environment.
    server = sim_server.start(["llama-2-7b", "-tp", "8", "--max-model-len", str(LONG), "--sim-gpu", "rtx-3090",
                               "--sim-gpus", "8", "--sim-speedup", "100"])
    result = run_init(None, server.url, out=tmp_path / "cfg")
    monkeypatch.delenv(LONG_MAX_MODEL_LEN_VAR)  # the tuner's environment: init cannot see production's
    scenario = load_scenario(result.scenario_path)
    assert scenario.engine.flags["max-model-len"] == LONG

    report = run_checks(scenario, storage=None, log_dir=None)
    rule = by_name(report, "flag rules")
    assert report.exit_code == 2, [c.line() for c in report.checks]
    assert rule.status == "failed"  # type: ignore[attr-defined]
    # vLLM's own words (vllm/config/model.py), and the fix names the field.
    assert f"User-specified max_model_len ({LONG}) is greater than the derived max_model_len " \
           "(max_position_embeddings=4096" in rule.detail  # type: ignore[attr-defined]
    assert f"{LONG_MAX_MODEL_LEN_VAR}: \"1\" to engine.env" in rule.fix  # type: ignore[attr-defined]

    # The fix the row names clears it.
    data = yaml.safe_load(result.scenario_path.read_text())
    data["engine"]["env"] = {LONG_MAX_MODEL_LEN_VAR: "1"}
    fixed = run_checks(load_scenario(write(tmp_path, data)), storage=None, log_dir=None)
    assert by_name(fixed, "flag rules").status == "ok"  # type: ignore[attr-defined]
    assert by_name(fixed, "model fits").status == "ok"  # type: ignore[attr-defined]

    # The daemon config of an endpoint alone: no argv to restart production with, so it proposes.
    text = result.daemon_path.read_text()
    daemon = yaml.safe_load(text)
    assert daemon["deploy"]["kind"] == "file" and daemon["approve"] == "manual"
    assert "start" not in daemon["deploy"] and "  # stop: [" in text and "  # start: [" in text
    assert text.splitlines()[0].endswith(f"run it with `autotuner daemon run {result.daemon_path}`.")
    loaded = load_config(result.daemon_path)
    assert loaded.config.approve == "manual" and loaded.config.deploy.kind == "file"
    # What init prints after writing it: the cycle's plan, and why it cannot take production down.
    lines = plan_lines(result.daemon_path)
    assert "cycle: window: 01:00-06:00" in lines
    assert any(line.startswith("warning: a cycle cannot complete:") and "deploy.stop and deploy.start" in line
               for line in lines), lines


def sim_scenario(tmp_path: Path, model: str, tp: int, **flags: object) -> Path:
    return write(tmp_path, {
        "name": "fit", "engine": {"kind": "sim", "model": model, "sim": {"gpu": "rtx-3090", "gpus": 8},
                                  "flags": {"tensor-parallel-size": tp, "max-model-len": 4096, **flags}},
        "workload": {"requests": {"count": 4, "prompt_tokens": 1000, "output_tokens": 16}},
        # No offload searched: the weights must fit on the GPUs.
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 512, "high": 8192},
                         "gpu-memory-utilization": {"type": "float", "low": 0.8, "high": 0.95, "step": 0.01}},
    }, f"fit-{model}-{tp}.yaml")


def test_doctor_fails_a_tensor_parallel_size_that_cannot_hold_the_model(tmp_path: Path) -> None:
    # llama-2-70b: 128 GiB of fp16 weights, 64 GiB per GPU at TP 2 on 24 GiB cards.
    report = run_checks(load_scenario(sim_scenario(tmp_path, "llama-2-70b", 2)), storage=None, log_dir=None)
    fits = by_name(report, "model fits")
    assert report.exit_code == 2 and fits.status == "failed", fits  # type: ignore[attr-defined]
    assert "No available memory for the cache blocks" in fits.detail  # type: ignore[attr-defined]
    assert "tensor-parallel-size: 8" in fits.fix  # type: ignore[attr-defined]  # 4 holds 32 GiB: still too much

    ok = run_checks(load_scenario(sim_scenario(tmp_path, "llama-2-70b", 8)), storage=None, log_dir=None)
    assert by_name(ok, "model fits").status == "ok"  # type: ignore[attr-defined]

    # TP × PP above the box's GPUs: vLLM's world-size rule, whatever is searched.
    world = run_checks(load_scenario(sim_scenario(tmp_path, "llama-2-70b", 8, **{"pipeline-parallel-size": 2})),
                       storage=None, log_dir=None)
    rule = by_name(world, "flag rules")
    assert rule.status == "failed" and "World size (16)" in rule.detail  # type: ignore[attr-defined]


def test_a_local_models_context_is_derived_from_its_config_json(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 2048,
              "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "torch_dtype": "float16"}
    (model / "config.json").write_text(json.dumps(config))
    assert derived_max_model_len(config) == (4096, "max_position_embeddings")  # vLLM applies the factor
    path = write(tmp_path, {"name": "local", "engine": {"kind": "vllm", "model": str(model),
                                                       "flags": {"max-model-len": 8192}},
                            "monitor": {"kind": "host"},
                            "workload": {"requests": {"count": 2, "prompt_tokens": 100, "output_tokens": 8}}})
    rule = by_name(run_checks(load_scenario(path), storage=None, log_dir=None), "flag rules")
    assert rule.status == "failed" and "(max_position_embeddings=4096" in rule.detail  # type: ignore[attr-defined]


def eight_gpu_box(state: Path) -> None:
    gpu = load_gpu("rtx-3090")
    GpuHost(state).ensure_inventory(make_gpus(state, gpu.product_name, gpu.memory_bytes, 8))


def test_the_gpu_row_of_a_tp8_scenario_on_an_8_gpu_box_lists_the_monitors_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "gpus"
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(state))
    eight_gpu_box(state)
    engine = {"kind": "vllm", "model": "llama-2-13b", "flags": {"tensor-parallel-size": 8}}
    workload = {"requests": {"count": 2, "prompt_tokens": 100, "output_tokens": 8}}
    watched = load_scenario(write(tmp_path, {"name": "tp8", "engine": engine, "monitor": {"kind": "sim"},
                                             "workload": workload}, "sim.yaml"))
    row, platform = check_gpus(watched)
    assert row.status == "ok", row
    assert "GPUs 0-7: 8 × NVIDIA GeForce RTX 3090 (23.7 GiB)" in row.detail
    assert platform is not None and platform.count == 8

    # Two of them in engine.gpus: TP 8 cannot run there, and the row says why and what to change.
    two = load_scenario(write(tmp_path, {"name": "tp8", "engine": {**engine, "gpus": [0, 1]},
                                         "monitor": {"kind": "sim"}, "workload": workload}, "two.yaml"))
    row, _ = check_gpus(two)
    assert row.status == "failed" and "is 8, but the monitor watches 2 GPUs" in row.detail
    assert "engine.gpus" in (row.fix or "")

    from autotuner.monitor import NvmlUnavailableError
    from autotuner.watch.inventory import gpu_inventory

    try:
        gpu_inventory("nvml")
    except NvmlUnavailableError:
        pass
    else:
        return  # real GPUs here: `auto` watches them, not the simulated box
    # monitor.kind auto finds no NVML and falls back to host memory while init listed 8 GPUs.
    auto = load_scenario(write(tmp_path, {"name": "tp8", "engine": engine, "workload": workload}, "auto.yaml"))
    row, _ = check_gpus(auto)
    assert row.status == "failed", row
    assert "lists 8 GPUs: 0-7 NVIDIA GeForce RTX 3090" in row.detail and "is 8" in row.detail
    assert "monitor.kind: sim" in (row.fix or "")
