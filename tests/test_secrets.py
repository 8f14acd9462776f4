"""No secret in anything the tuner writes: canary values in the environment (a Hugging Face token that
engine.env takes through `${VAR}`, the API key, a storage URL's password) go through a real tuning
run on the simulator, status, every export format and the report; then every byte written and every
line printed is searched for them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote_plus

import pytest
import yaml

from autotuner.export.formats import FORMATS
from autotuner.logs import redact_secrets
from autotuner.secrets import display_url, redact, remember
from autotuner.store.db import Store

# A quote, a backslash and non-ASCII: json.dumps and YAML escape them, so a mask of the raw text alone misses.
HF_CANARY = 'hf_canary_"T0k\\3n_é5f1c2d9e'
KEY_CANARY = "sk-canary-ApiKey-77aa31"
DB_CANARY = "pw-canary-Db-4242xyz"
QUERY_CANARY = "pw-canary-Query-5151abc"
CANARIES = (HF_CANARY, KEY_CANARY, DB_CANARY, QUERY_CANARY)
PG_URL = f"postgresql://tuner:{DB_CANARY}@127.0.0.1:1/studies"
PG_QUERY_URL = f"postgresql://tuner@127.0.0.1:1/studies?password={QUERY_CANARY}"


def forms(canary: str) -> set[bytes]:
    """The canary as each writer would render it: raw, JSON-escaped (ASCII or not), YAML, URL-quoted."""
    texts = {canary, json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1], quote_plus(canary),
             yaml.safe_dump(canary, default_style='"').strip().removesuffix("...").strip()[1:-1]}
    return {t.encode() for t in texts}


def scenario(tmp_path: Path) -> Path:
    data = {
        "name": "canary",
        "engine": {"kind": "sim", "model": "llama-2-7b", "flags": {"max-model-len": 4096},
                   "env": {"HF_TOKEN": "${TEST_HF_VALUE}", "VLLM_LOGGING_LEVEL": "INFO"},
                   "api_key_env": "MY_SERVICE_KEY", "sim": {"gpu": "a100-80gb", "gpus": 1, "speedup": 20},
                   "startup_timeout_s": 60},
        "monitor": {"kind": "sim"},
        "workload": {"requests": {"count": 4, "prompt_tokens": "500-900", "output_tokens": 16},
                     "arrivals": {"kind": "concurrency", "concurrency": 2}, "warmup_requests": 0},
        "budget": {"trials": 1},
        # A storage URL with a password inside the scenario: it must not travel into the database either.
        "storage": f"postgresql://tuner:{DB_CANARY}@db.example:5432/studies",
    }
    path = tmp_path / "canary.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "autotuner", *args], capture_output=True, timeout=600, env=env,
                          cwd=cwd)


def test_no_canary_in_anything_written_or_printed(tmp_path: Path, sim_state: Path) -> None:
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home"), "TEST_HF_VALUE": HF_CANARY,
           "MY_SERVICE_KEY": KEY_CANARY}
    db = tmp_path / "study.db"
    outputs: list[subprocess.CompletedProcess[bytes]] = []

    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[bytes]:
        done = run(*args, env=env, cwd=tmp_path)
        outputs.append(done)
        if ok:
            assert done.returncode == 0, (args, done.stderr.decode(errors="replace")[-3000:])
        return done

    cli("tune", str(scenario(tmp_path)), "--storage", str(db), "--trials", "1", "--confirm", "0")
    cli("status", "--storage", str(db))
    cli("status", Store(str(db), create=False).studies()[0].study_name, "--storage", str(db))
    for fmt in FORMATS:
        cli("export", "--format", fmt, "-o", str(tmp_path / f"export.{fmt}"), "--storage", str(db),
            "--allow-unverified")
    cli("export", "--format", "cmd", "--storage", str(db), "--allow-unverified")  # to stdout
    cli("report", "-o", str(tmp_path / "report"), "--storage", str(db))
    # The password of a storage URL: refused (nothing listens), and not echoed.
    for args in (("tune", str(scenario(tmp_path)), "--storage", PG_URL), ("status", "--storage", PG_URL),
                 ("export", "--format", "yaml", "--storage", PG_URL), ("report", "-o", "r2", "--storage", PG_URL)):
        done = cli(*args, ok=False)
        assert done.returncode == 2, done.stderr
        assert b"postgresql://tuner:***@127.0.0.1:1/studies" in done.stderr
    for args in (("status", "--storage", PG_QUERY_URL), ("report", "-o", "r3", "--storage", PG_QUERY_URL)):
        done = cli(*args, ok=False)
        assert done.returncode == 2, done.stderr
        assert b"postgresql://tuner@127.0.0.1:1/studies?password=***" in done.stderr

    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "canary.yaml"]
    names = {p.name for p in written}
    assert {"study.db", "export.yaml", "export.json", "report.md"} <= names
    assert any(p.suffix == ".log" for p in written), "the engine's log was kept"
    for path in written:
        data = path.read_bytes()
        for canary in CANARIES:
            for form in forms(canary):
                assert form not in data, f"{form!r} in {path}"
    for done in outputs:
        for canary in CANARIES:
            for form in forms(canary):
                assert form not in done.stdout + done.stderr, (form, done.args)
    # What holds run details is the owner's only: the database, the JSONL log, the engine's log.
    private = [tmp_path / "study.db", *(p for p in (tmp_path / "home" / "logs").rglob("*") if p.is_file())]
    assert any(p.suffix == ".jsonl" for p in private) and any(p.suffix == ".log" for p in private), private
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # The name of what was left out is there, for the deployer to supply.
    assert "HF_TOKEN" in (tmp_path / "export.yaml").read_text()
    assert b"${TEST_HF_VALUE}" in (tmp_path / "study.db").read_bytes() + \
        b"".join(p.read_bytes() for p in tmp_path.glob("study.db*"))


def test_display_url_hides_the_password() -> None:
    assert display_url(PG_URL) == "postgresql://tuner:***@127.0.0.1:1/studies"
    assert display_url("sqlite:///x.db") == "sqlite:///x.db"
    assert display_url("relative/path.db") == "relative/path.db"


def test_log_processor_masks_known_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-canary-123456")
    remember("remembered-canary-99")
    event = {"event": "x", "url": PG_URL, "nested": {"argv": ["--key", "tok-canary-123456"]},
             "text": "got remembered-canary-99 back", "n": 3}
    out = redact_secrets(None, "info", event)
    flat = repr(out)
    for canary in ("tok-canary-123456", "remembered-canary-99", DB_CANARY):
        assert canary not in flat
    assert out["n"] == 3 and out["nested"]["argv"][0] == "--key"
    assert redact("plain text") == "plain text"
