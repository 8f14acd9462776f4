"""Each path a secret took in the adversarial review (issue 23), closed: Optuna's own user attributes, a
secret that JSON/YAML/URL encoding escapes, a `?password=` storage URL, an endpoint URL's password in
/status, the engine's environment, file modes, a model that reads as an option, raw HTML in report.md.

Unit-level where the behaviour is (real SQLite, real Optuna, real YAML files); the CLI as a subprocess
where a user meets it. The full tuning run with canaries is tests/test_secrets.py."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, quote_plus

import optuna
import pytest
import yaml

from autotuner import secrets
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store, TrialRecord
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult

REPO = Path(__file__).resolve().parents[2]
# A secret json.dumps and YAML escape: a quote, a backslash, non-ASCII.
ODD = 'pw"q\\b-sé-canäry-ü7'
QUERY_CANARY = "pw-query-canary-3141"
ENDPOINT_CANARY = "pw-endpoint-canary-2718"


def every_form(value: str) -> list[str]:
    """The raw value and what each writer turns it into: what must not be found."""
    return [value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
            yaml.safe_dump(value).strip().strip("'\"").removesuffix("\n..."), quote(value), quote_plus(value)]


def quickstart(**engine: object) -> Scenario:
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data["engine"].update(engine)
    return Scenario.model_validate(data)


@pytest.fixture(autouse=True)
def odd_secret() -> None:
    secrets.remember(ODD)


# --- item 2: values redacted before they are serialised; every encoding matched ------------------------------

def test_redact_matches_every_encoding_of_a_known_secret() -> None:
    for text in (json.dumps({"r": f"x {ODD} y"}), json.dumps({"r": ODD}, ensure_ascii=False),
                 yaml.safe_dump({"r": ODD}), yaml.safe_dump({"r": ODD}, allow_unicode=True),
                 yaml.safe_dump({"r": ODD}, default_style="'"), f"u={quote(ODD)}", f"u={quote_plus(ODD)}"):
        masked = secrets.redact(text)
        assert all(form not in masked for form in every_form(ODD)), (text, masked)
        assert "***" in masked
    assert secrets.redact_value({"a": [ODD, 3, None], ODD: {"k": f"pre {ODD}"}}) == {"a": ["***", 3, None],
                                                                              "***": {"k": "pre ***"}}


def test_a_secret_json_escapes_never_reaches_our_rows(tmp_path: Path) -> None:
    from autotuner.daemon.state import CycleStore

    db = tmp_path / "s.db"
    store = Store(str(db))
    reason = f"engine said: token={ODD}"
    store.save_trial("st", TrialRecord(0, "search", "startup-failed", reason, "COMPLETE", {"x": ODD},
                                       {"reason": reason, "engine": {"argv": ["--k", ODD]}}, [], [reason],
                                       time.time(), time.time()))
    states = CycleStore(store, "prod")
    cycle = states.begin("schedule", {"note": reason}, {"root": ODD})
    states.note("trigger", {"why": reason}, cycle.id)
    states.transition(cycle, "done", {"reason": reason}, outcome="skipped", reason=reason)
    store.engine.dispose()
    data = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    for form in every_form(ODD):
        assert form.encode() not in data, form


# --- item 1: Optuna's own trial_user_attributes -----------------------------------------------------------

def test_optuna_user_attributes_hold_the_masked_reason(tmp_path: Path) -> None:
    from autotuner.tuner.recording import TrialRecorder

    db = tmp_path / "o.db"
    store = Store(str(db))
    study = optuna.create_study(storage=store.optuna_storage(), study_name="s", directions=["maximize", "minimize"])
    scenario = quickstart()
    recorder = TrialRecorder(scenario, store, "s", lambda _kind, _data: None)
    for infrastructure in (False, True):
        trial = study.ask()
        result = TrialResult(Outcome.STARTUP_FAILED, f"engine exited: HF_TOKEN={ODD} rejected", {}, [],
                             infrastructure=infrastructure)
        recorder.tell(study, trial, "search", result, time.time())
    store.engine.dispose()
    with sqlite3.connect(db) as conn:
        attrs = " ".join(row[0] for row in conn.execute("SELECT value_json FROM trial_user_attributes"))
    assert "rejected" in attrs
    for form in every_form(ODD):
        assert form not in attrs, form


# --- item 3: ?password= in a storage URL, a password in the endpoint URL ----------------------------------

def test_a_query_password_is_masked_and_remembered() -> None:
    url = f"postgresql://tuner@db.example:5432/studies?password={QUERY_CANARY}&sslmode=require"
    assert secrets.display_url(url) == "postgresql://tuner@db.example:5432/studies?password=***&sslmode=require"
    secrets.remember_url_password(url)
    assert QUERY_CANARY not in secrets.redact(f"could not connect: password {QUERY_CANARY!r} refused")


def test_a_query_password_never_printed_by_the_cli(tmp_path: Path) -> None:
    canary = "pw-cli-query-canary-1618"
    url = f"postgresql://tuner@127.0.0.1:1/studies?password={canary}"
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "autotuner", "status", "--storage", url], capture_output=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert b"password=***" in done.stderr and canary.encode() not in done.stdout + done.stderr


def test_an_endpoint_password_never_in_status(tmp_path: Path) -> None:
    from autotuner.daemon.config import load_config
    from autotuner.daemon.state import CycleStore
    from autotuner.daemon.status import status_document
    from tests.support.daemon import SCENARIO

    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    endpoint = f"http://ops:{ENDPOINT_CANARY}@127.0.0.1:1"
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump({
        "scenario": "scenario.yaml", "production": {"endpoint": endpoint},
        "deploy": {"kind": "file", "config_path": "tuned.yaml"}, "storage": "state.db"}))
    loaded = load_config(tmp_path / "daemon.yaml")
    states = CycleStore(Store(str(tmp_path / "state.db")), loaded.scenario.name)
    states.note("trigger", {"error": f"GET {endpoint}/v1/models refused", "pw": ODD})
    # What GET /status answers (the running daemon adds its runtime), and `daemon status --json`.
    doc = status_document(states, loaded.config, {"production_endpoint": endpoint})
    text = json.dumps(doc)
    assert "http://ops:***@127.0.0.1:1" in text and ENDPOINT_CANARY not in text
    for form in every_form(ODD):
        assert form not in text


# --- item 5: the engine's environment; file modes ---------------------------------------------------------

def test_an_engine_gets_only_the_secrets_it_was_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotuner.engine.launch import plan_launch

    monkeypatch.setenv("SRC_TOKEN_VALUE", "hf-asked-canary")  # checked when the scenario loads
    db_password = "pw-db-env-canary-1414"
    secrets.remember_url_password(f"postgresql://tuner:{db_password}@db/x")
    environ = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "CUDA_HOME": "/cuda", "VLLM_PYTHON": "/py",
               "HF_HOME": "/hf", "OMP_NUM_THREADS": "2", "TORCHINDUCTOR_CACHE_DIR": "/t", "TMPDIR": "/tmp",
               "LD_LIBRARY_PATH": "/lib", "TOKENIZERS_PARALLELISM": "false",
               "AUTOTUNER_DAEMON_TOKEN": "daemon-token-canary", "PGPASSWORD": "pg-canary-xyz",
               "OTHER_SERVICE_API_KEY": "other-canary-key", "HF_TOKEN": "hf-not-asked-canary",
               "STATE_DB": f"postgresql://tuner:{db_password}@db/x", "SRC_TOKEN_VALUE": "hf-asked-canary",
               "MY_KEY": "api-key-canary-1", "HTTPS_PROXY": "http://u:proxy-pw-1@proxy:3128"}
    scenario = quickstart(kind="vllm", model="meta-llama/Llama-2-7b-hf", env={"HF_TOKEN": "${SRC_TOKEN_VALUE}"},
                          api_key_env="MY_KEY")
    env = plan_launch(scenario, {}, port=12345, environ=environ).env
    for name in ("PATH", "HOME", "LANG", "CUDA_HOME", "VLLM_PYTHON", "HF_HOME", "OMP_NUM_THREADS",
                 "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "LD_LIBRARY_PATH", "TOKENIZERS_PARALLELISM", "MY_KEY",
                 "HTTPS_PROXY"):  # the engine downloads through the proxy, credentials and all
        assert env[name] == environ[name], name
    assert env["HF_TOKEN"] == "hf-asked-canary" and env["VLLM_API_KEY"] == "api-key-canary-1"
    for name in ("AUTOTUNER_DAEMON_TOKEN", "PGPASSWORD", "OTHER_SERVICE_API_KEY", "STATE_DB"):
        assert name not in env, name
    # Not named by the scenario, an exported Hugging Face token still reaches the engine (gated downloads).
    bare = plan_launch(quickstart(kind="vllm", model="meta-llama/Llama-2-7b-hf"), {}, port=12345,
                       environ=environ).env
    assert bare["HF_TOKEN"] == "hf-not-asked-canary" and "PGPASSWORD" not in bare
    # A deploy command: production's own start may need its HF_TOKEN, never the daemon's token or database.
    deploy = secrets.child_environment(environ, only_ours=True)
    assert "HF_TOKEN" in deploy and "AUTOTUNER_DAEMON_TOKEN" not in deploy and "STATE_DB" not in deploy


def test_files_with_run_details_are_private(tmp_path: Path) -> None:
    from autotuner.logs import LogSinks
    from autotuner.private_files import append_binary

    old = os.umask(0o022)
    try:
        Store(str(tmp_path / "new.db")).engine.dispose()
        sinks = LogSinks("none")
        sinks.attach(tmp_path / "home" / "logs" / "x.jsonl")
        sinks.write({"event": "e"})
        sinks.close()
        with append_binary(tmp_path / "home" / "logs" / "study" / "engine-1.log") as log:
            log.write(b"line\n")
    finally:
        os.umask(old)
    for path in (tmp_path / "new.db", tmp_path / "home" / "logs" / "x.jsonl",
                 tmp_path / "home" / "logs" / "study" / "engine-1.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (tmp_path / "home" / "logs", tmp_path / "home" / "logs" / "study"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


# --- item 6: a model that would be read as an option ------------------------------------------------------

@pytest.mark.parametrize("engine", [{"model": "--trust-remote-code"}, {"served_model_name": "--config=/tmp/x"}])
def test_a_model_starting_with_a_dash_is_refused_at_launch(engine: dict[str, str]) -> None:
    from autotuner.engine.launch import plan_launch

    scenario = quickstart(kind="vllm", **({"model": "meta-llama/Llama-2-7b-hf"} | engine))
    with pytest.raises(UserInputError, match=r"^engine\.(model|served_model_name): .* starts with '-'"):
        plan_launch(scenario, {}, port=12345, environ={"PATH": "/usr/bin"})


# --- item 7: report.md escapes raw HTML from an engine's reason -------------------------------------------

def test_report_md_escapes_html_from_a_reason(tmp_path: Path) -> None:
    from autotuner.export.report import run_report
    from tests.support.studies import KNOWN_FRONT, key_for, trial

    scenario = quickstart(kind="vllm", model="meta-llama/Llama-2-13b-hf", flags={}, sim={})
    storage = str(tmp_path / "r.db")
    store = Store(storage)
    from autotuner.store.db import StudyRecord

    store.save_study(StudyRecord("s", scenario.name, key_for(scenario), json.loads(scenario.model_dump_json()),
                                 None, time.time()))
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    for record in [trial(0, None, None, kind="baseline", outcome="oom-crash", reason=evil), *KNOWN_FRONT[1:4]]:
        store.save_trial("s", record)
    assert run_report(storage, None, tmp_path / "out") == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "&lt;script&gt;" in md and "<script>" not in md and "<img" not in md


def test_tune_refuses_a_dash_led_served_name_before_writing_anything(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data["engine"].update(kind="sim-virtual", served_model_name="--config=/tmp/x")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(scenario), "--storage",
                           str(tmp_path / "s.db"), "--trials", "1"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "engine.served_model_name: '--config=/tmp/x' starts with '-'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "s.db").exists()


# --- item 4: engine.model stored as written ----------------------------------------------------------------

def test_a_model_given_by_variable_is_stored_as_written_and_exports_without_it(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data["engine"].update(kind="sim-virtual", model="${TUNED_MODEL_ID}")
    data["budget"] = {"trials": 1}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    db = tmp_path / "s.db"
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home"), "TUNED_MODEL_ID": "llama-2-7b"}
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(scenario), "--storage", str(db),
                           "--confirm", "0"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        stored = json.loads(conn.execute("SELECT scenario FROM at_studies").fetchone()[0])
    assert stored["engine"]["model"] == "${TUNED_MODEL_ID}"
    # Exported where the variable is not set: the study still reads, and nothing says `***`.
    env.pop("TUNED_MODEL_ID")
    out = tmp_path / "vllm.json"
    done = subprocess.run([sys.executable, "-m", "autotuner", "export", "--storage", str(db), "--format", "json",
                           "-o", str(out), "--allow-unverified"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "***" not in out.read_text()
