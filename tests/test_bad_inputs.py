"""Bad input, generated and hand-written: every document either loads or is refused as bad input
(`UserInputError`, and through the CLI exit 2 with `file:line: field: what is allowed`) — never a
traceback, and nothing written.

Generated (hypothesis, > 500 documents): scenarios (mutated from a valid one, and raw text), `--set`
items, storage URLs, trace JSONL, GPU YAML and model config.json. Hand-written: the corpus under
tests/fixtures/bad_inputs/, each file with the message it must get.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotuner.catalog.gpus import _FILE_FIELDS, load_gpu
from autotuner.catalog.models import load_model
from autotuner.cli.app import app
from autotuner.engine.launch import parse_set
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario, load_scenario
from autotuner.store.db import Store
from autotuner.trials.scoring import threshold_of
from autotuner.tuner.space import build_space
from autotuner.vllm.flags import flag_argv
from autotuner.workload.trace import load_trace
from tests.support.bad_inputs import CORPUS, scenario_for

# Each case's budget: together well under a minute on a loaded 2-core machine.
FAST = dict(deadline=None, database=None, derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.filter_too_much, HealthCheck.data_too_large])


def _where(path: Path) -> re.Pattern[str]:
    """`path:line: ...` (`path: ...` for a whole-file problem such as an empty trace); the corpus below
    checks the field each message names."""
    return re.compile(rf"^{re.escape(str(path))}(:\d+)?: \S")


scalars = (st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["", "0", "-1", "1e400", "${NOT_SET_X}", "auto", "3000-6000",
                                                     "nan", "true", "~", "\n", "8h"]))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _scratch(base: Path, suffix: str) -> Path:
    return base / f"{uuid.uuid4().hex}{suffix}"


# --- scenarios -----------------------------------------------------------------------------------------

VALID: dict[str, Any] = {
    "name": "gen",
    "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "flags": {"max-model-len": 4096},
               "env": {"A": "b"}, "sim": {"gpu": "a100-80gb", "speedup": 10}},
    "workload": {"requests": {"count": 4, "prompt_tokens": "100-200", "output_tokens": 8},
                 "arrivals": {"kind": "concurrency", "concurrency": 2}},
    "search_space": {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 4096, "log": True}},
    "oom_threshold": {"fraction": 0.97},
    "slos": {"ttft_p95_s": 10.0},
    "objectives": [{"metric": "output_tokens_per_s", "direction": "maximize"}],
    "budget": {"trials": 3},
    "monitor": {"kind": "sim", "hz": 100},
}
PATHS = [
    ("name",), ("engine",), ("engine", "kind"), ("engine", "model"), ("engine", "flags"),
    ("engine", "flags", "max-num-seqs"), ("engine", "flags", "tensor-parallel-size"), ("engine", "env", "HF_HOME"),
    ("engine", "gpus"), ("engine", "startup_timeout_s"), ("engine", "sim", "gpu"), ("engine", "sim", "gpus"),
    ("engine", "sim", "speedup"), ("engine", "api_key_env"), ("engine", "command"), ("workload",),
    ("workload", "requests", "count"), ("workload", "requests", "prompt_tokens"),
    ("workload", "requests", "output_tokens"), ("workload", "requests", "kind"), ("workload", "requests", "path"),
    ("workload", "arrivals", "kind"), ("workload", "arrivals", "rate"), ("workload", "arrivals", "concurrency"),
    ("workload", "max_duration_s"), ("search_space",), ("search_space", "max-num-batched-tokens", "low"),
    ("search_space", "max-num-batched-tokens", "high"), ("search_space", "gpu-memory-utilization"),
    ("oom_threshold",), ("oom_threshold", "fraction"), ("oom_threshold", "min_free_mib"), ("slos",),
    ("slos", "ttft_p95_s"), ("slos", "itl_p99_s"), ("objectives",), ("objectives", 0, "metric"),
    ("budget", "trials"), ("budget", "timeout"), ("monitor", "hz"), ("current_config",), ("storage",), ("bogus",),
]


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = doc
    for part in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(part, {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return
        if not isinstance(node, dict | list):
            return
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)):
        node[path[-1]] = value


def _check_scenario(path: Path) -> None:
    try:
        sc = load_scenario(path)
    except UserInputError as exc:
        assert _where(path).match(str(exc)), str(exc)
        return
    # What loads is usable: its workload, search space and threshold build, and it survives the
    # database round trip.
    try:
        sc.workload.to_spec(path.parent)
        build_space(sc)
    except UserInputError:
        pass
    threshold_of(sc)
    Scenario.model_validate(sc.model_dump(mode="json"), context={"stored": True})


@settings(max_examples=120, **FAST)
@given(mutations=st.lists(st.tuples(st.sampled_from(PATHS), junk), min_size=1, max_size=3))
def test_generated_scenarios(tmp_path: Path, mutations: list[tuple[tuple[Any, ...], Any]]) -> None:
    doc = json.loads(json.dumps(VALID))
    for where, value in mutations:
        _set(doc, where, value)
    path = _scratch(tmp_path, ".yaml")
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    _check_scenario(path)


@settings(max_examples=40, **FAST)
@given(text=st.text(max_size=200) | st.binary(max_size=100).map(lambda b: b.decode("latin-1")))
def test_generated_scenario_text(tmp_path: Path, text: str) -> None:
    path = _scratch(tmp_path, ".yaml")
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    _check_scenario(path)


# --- --set ---------------------------------------------------------------------------------------------

set_items = st.lists(st.text(max_size=20) | st.builds(lambda k, v: f"{k}={v}", st.text(max_size=12),
                                                       st.text(max_size=12) | scalars.map(str)), max_size=4)


@settings(max_examples=130, **FAST)
@given(items=set_items)
def test_generated_set_items(items: list[str]) -> None:
    try:
        flags = parse_set(items)
    except UserInputError as exc:
        assert str(exc).startswith("--set "), str(exc)
        return
    assert all(isinstance(k, str) and k for k in flags)
    flag_argv(flags)


# --- storage URLs --------------------------------------------------------------------------------------

PASSWORD = "pw-gen-Zq81x"
urls = (st.text(max_size=40).filter(lambda u: "://" in u or "/" not in u.strip("./"))
        | st.builds(lambda scheme, user, host, port, db: f"{scheme}://{user}:{PASSWORD}@{host}:{port}/{db}",
                    st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "sqlite", "nosuch", "oracle"]),
                    st.text("abc_", min_size=1, max_size=6), st.sampled_from(["127.0.0.1", "[::1]", "", "%zz"]),
                    st.sampled_from(["1", "9", "0", "99999", "x"]), st.text("abcd/._", max_size=8))
        | st.builds(lambda name: f"sqlite:///{name}", st.text(max_size=20)))


@settings(max_examples=40, **FAST)
@given(url=urls)
def test_generated_storage_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.chdir(tmp_path)  # a bare name is a SQLite file here, never in the repository
    try:
        store = Store(url)
    except UserInputError as exc:
        assert PASSWORD not in str(exc)
        assert str(exc).startswith("storage "), str(exc)
        return
    store.engine.dispose()


# --- trace JSONL ---------------------------------------------------------------------------------------

request_like = st.fixed_dictionaries({}, optional={
    "prompt": st.text(max_size=10) | junk, "messages": junk | st.lists(st.fixed_dictionaries(
        {}, optional={"role": st.text(max_size=5) | junk, "content": st.text(max_size=5) | junk}), max_size=2),
    "max_tokens": st.integers(-3, 10) | junk, "arrival_s": st.floats() | junk})
trace_lines = st.lists(request_like.map(json.dumps) | junk.map(json.dumps) | st.text(max_size=30),
                       max_size=5)


@settings(max_examples=70, **FAST)
@given(lines=trace_lines, require_arrival=st.booleans())
def test_generated_traces(tmp_path: Path, lines: list[str], require_arrival: bool) -> None:
    path = _scratch(tmp_path, ".jsonl")
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogateescape")
    try:
        reqs = load_trace(path, require_arrival=require_arrival)
    except UserInputError as exc:
        assert _where(path).match(str(exc)), str(exc)
        return
    for r in reqs:
        assert r.max_tokens >= 1 and (r.prompt or r.messages)
        assert r.arrival_s is None or (math.isfinite(r.arrival_s) and r.arrival_s >= 0)


# --- GPU YAML ------------------------------------------------------------------------------------------

gpu_docs = st.dictionaries(st.sampled_from([*_FILE_FIELDS, "product_name", "memory_gb", "1"]),
                           st.floats(-10, 2000) | st.integers(-5, 10**8) | junk, max_size=8)


@settings(max_examples=60, **FAST)
@given(doc=gpu_docs | junk)
def test_generated_gpu_files(tmp_path: Path, doc: Any) -> None:
    path = _scratch(tmp_path, ".yaml")
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        gpu = load_gpu(str(path))
    except UserInputError as exc:
        assert _where(path).match(str(exc)), str(exc)
        return
    numbers = (gpu.memory_gib, gpu.bandwidth_gbps, gpu.fp16_tflops, gpu.pcie_gbps)
    assert all(math.isfinite(v) and v > 0 for v in numbers) and gpu.nvlink_gbps >= 0
    assert gpu.memory_bytes > 0 and gpu.link_gbps > 0


# --- model config.json ---------------------------------------------------------------------------------

HF_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
           "intermediate_size", "vocab_size", "max_position_embeddings", "torch_dtype", "rope_scaling",
           "tie_word_embeddings", "text_config"]
model_docs = st.dictionaries(st.sampled_from(HF_KEYS), st.integers(-4, 5000) | junk, max_size=12)


@settings(max_examples=70, **FAST)
@given(doc=model_docs | junk, complete=st.booleans())
def test_generated_model_configs(tmp_path: Path, doc: Any, complete: bool) -> None:
    if complete and isinstance(doc, dict):  # mostly valid, so that the checks past the first run too
        doc = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512,
               "vocab_size": 1000, "max_position_embeddings": 512, **doc}
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(doc))
    try:
        model = load_model(str(folder))
    except UserInputError as exc:
        assert _where(folder / "config.json").match(str(exc)), str(exc)
        return
    assert model.weight_bytes > 0 and model.kv_bytes_per_token(1) > 0 and model.head_dim > 0
    assert model.derived_max_model_len > 0
    model.fingerprint()


# --- the hand-written corpus, through the CLI ----------------------------------------------------------

EXPECTED = {
    "scenarios/s01_slo_zero.yaml": ":6: slos.ttft_p95_s: Input should be greater than 0",
    "scenarios/s02_slo_negative.yaml": ":7: slos.e2e_p95_s: Input should be greater than 0",
    "scenarios/s03_misspelt_engine.yaml": ":1: engine: is required (and 1 more problem(s))",
    "scenarios/s04_bad_kind.yaml": ":3: engine.kind: must be one of 'vllm', 'sim' or 'sim-virtual', got 'tgi'",
    "scenarios/s05_tab_indent.yaml": ":2: not valid YAML: found character '\\t' that cannot start any token",
    "scenarios/s06_list_at_top.yaml": ":1: (top level): a scenario is a mapping",
    "scenarios/s07_empty.yaml": ":1: (top level): a scenario is a mapping",
    "scenarios/s08_reserved_flag.yaml": ":5: engine.flags: flag 'port' is set by the tuner",
    "scenarios/s09_bad_flag_name.yaml": ":5: engine.flags: flag name 'Max Num Seqs' is not a vLLM long option",
    "scenarios/s10_threshold_both.yaml": ":5: oom_threshold: give either fraction",
    "scenarios/s11_fraction_above_1.yaml": ":6: oom_threshold.fraction: Input should be less than or equal to 1",
    "scenarios/s12_low_above_high.yaml": ":7: workload.requests.prompt_tokens: low must be ≤ high",
    "scenarios/s13_poisson_without_rate.yaml": ":6: workload.arrivals: kind poisson needs rate",
    "scenarios/s14_param_without_high.yaml": ":6: search_space.max-num-batched-tokens: type int needs low and high",
    "scenarios/s15_unset_variable.yaml": ":3: engine.model: '${AUTOTUNER_SURELY_UNSET_VARIABLE}' uses",
    "scenarios/s16_unknown_metric.yaml": ":6: objectives.0.metric: must be one of",
    "scenarios/s17_zero_trials.yaml": ":6: budget.trials: Input should be greater than or equal to 1",
    "scenarios/s18_not_utf8.yaml": ": not UTF-8 text",
    "scenarios/s19_missing_trace.yaml": ":8: workload.requests.path: no such trace file",
    "scenarios/s20_nan_rate.yaml": ":6: monitor.hz: Input should be",
    "scenarios/s21_env_not_text.yaml": ":6: engine.env.HF_HOME: Input should be a valid string",
    "scenarios/s22_count_not_number.yaml": ":7: workload.requests.count: Input should be a valid integer",
    "scenarios/s23_name_dotdot.yaml": ":1: name: '..' cannot name files",
    "scenarios/s24_env_name_not_posix.yaml": ":4: engine.env: variable name 'A;touch /tmp/pwned' is not a POSIX name",
    "scenarios/s25_count_true.yaml": ":6: workload.requests.count: Input should be a valid integer, got True",
    "scenarios/s26_duplicate_key.yaml": ":6: not valid YAML: duplicate key 'trials' (lines 5 and 6)",
    "scenarios/s27_alias_bomb.yaml": ": more than 100000 values once its aliases",
    "scenarios/s28_infinite_time_scale.yaml": ":6: workload.arrivals.time_scale: Input should be a finite number",
    "scenarios/s29_lognormal_sigma_huge.yaml": ":6: workload.requests.prompt_tokens.sigma: Input should be less than",
    "scenarios/s30_timeout_forever.yaml": ":5: budget.timeout: duration 'forever'",
    "scenarios/s31_virtual_with_trace.yaml": ":2: engine.kind: sim-virtual takes synthetic workloads only",
    "scenarios/s32_search_range_nan.yaml": ":5: search_space.gpu-memory-utilization.low: Input should be a finite",
    "traces/t09_fractional_max_tokens.jsonl": ":2: max_tokens: must be a positive integer, got 1.5",
    "traces/t01_not_json.jsonl": ":2: not valid JSON: Unterminated string",
    "traces/t02_array_line.jsonl": ":2: expected a JSON object, got list",
    "traces/t03_neither_prompt_nor_messages.jsonl": ":1: prompt/messages: give exactly one of",
    "traces/t04_zero_max_tokens.jsonl": ":1: max_tokens: must be a positive integer, got 0",
    "traces/t05_negative_arrival.jsonl": ":1: arrival_s: must be a number ≥ 0, got -1.5",
    "traces/t06_no_requests.jsonl": ": trace has no requests",
    "traces/t07_message_without_role.jsonl": ":1: messages[0]: must be an object with `role`",
    "traces/t08_no_arrival_for_trace_arrivals.jsonl": ":1: arrival_s: is required for trace arrivals",
    "gpus/g01_missing_fields.yaml": ":1: bandwidth_gbps: is required (and 3 more problem(s))",
    "gpus/g02_negative_memory.yaml": ":2: memory_gib: Input should be greater than 0, got -24",
    "gpus/g03_text_bandwidth.yaml": ":3: bandwidth_gbps: must be a number, got 'fast'",
    "gpus/g04_unknown_key.yaml": ":7: memory_gb: unknown field",
    "gpus/g05_not_a_mapping.yaml": ":1: (top level): expected a mapping with keys name, memory_gib",
    "gpus/g06_infinite_memory.yaml": ":2: memory_gib: Input should be a finite number",
    "gpus/g07_boolean_tflops.yaml": ":4: fp16_tflops: must be a number, got True",
    "models/m01_zero_hidden": "/config.json:1: hidden_size: must be a positive integer",
    "models/m02_text_layers": "/config.json:1: num_hidden_layers: must be a positive integer",
    "models/m03_unknown_dtype": "/config.json:1: torch_dtype: must be one of float16",
    "models/m04_text_config_list": "/config.json:1: text_config: must be an object",
    "models/m05_not_json": "/config.json:2: not valid JSON",
    "models/m06_negative_kv_heads": "/config.json:1: num_key_value_heads: must be a positive integer",
    "models/m07_more_heads_than_width": "/config.json:1: num_attention_heads: must be at most hidden_size (4)",
    "models/m08_rope_factor_text": "/config.json:1: rope_scaling: must be an object whose factor is a number",
    "models/m09_array": "/config.json:1: (top level): expected a JSON object",
}


def test_the_corpus_is_complete() -> None:
    on_disk = {str(p.relative_to(CORPUS)) for kind in ("scenarios", "traces", "gpus", "models")
               for p in (CORPUS / kind).iterdir()}
    assert on_disk == set(EXPECTED)
    assert len(on_disk) >= 30


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_corpus_through_the_cli(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    path = CORPUS / case
    scenario = scenario_for(path, tmp_path)
    before = set(tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["tune", str(scenario), "--storage", str(tmp_path / "study.db")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.stderr.strip()
    assert message.count("\n") == 0 and "Traceback" not in message, message
    file = str(path / "config.json") if path.is_dir() else str(path)
    assert message.startswith(f"error: {file}"), message
    assert EXPECTED[case] in message.removeprefix(f"error: {path!s}"), message
    assert set(tmp_path.rglob("*")) == before, "bad input writes nothing"


@pytest.mark.parametrize(("items", "message"), [
    (["novalue"], "expected NAME=VALUE"),
    (["=1"], "expected NAME=VALUE"),
])
def test_bad_set_items_exit_2(items: list[str], message: str, tmp_path: Path) -> None:
    scenario = scenario_for(CORPUS / "models" / "m01_zero_hidden", tmp_path)
    scenario.write_text(yaml.safe_dump({"engine": {"kind": "sim-virtual", "model": "llama-2-7b"}}))
    args = ["measure", str(scenario)] + [a for item in items for a in ("--set", item)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
