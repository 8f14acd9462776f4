"""A generated corpus of malformed inputs, each run the way a user would: `autotuner tune|doctor|measure` on a
scenario (with its trace, GPU file or model config.json), `daemon plan` on a daemon config, `measure --set`, and
raw requests to the daemon's HTTP endpoint. Every case is CERTAINLY invalid (a mutation that might still be
valid is not generated), so the outcome that counts as right is one: exit 2, no traceback, nothing written
besides the input.

Cases run in-process through typer's CliRunner (as `autotuner` would run them), in a process pool, each in its
own scratch directory with its own AUTOTUNER_HOME; a seeded sample also runs as `python -m autotuner` to prove
the subprocess path agrees.

    python benchmarks/fuzz.py [--seed 0] [-n 1000] [--work DIR]
    ... last line: fuzz_tried=N fuzz_tracebacks=N fuzz_wrong_exit=N fuzz_files_left=N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCENARIO: dict[str, Any] = {
    "name": "fuzz",
    "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "flags": {"max-model-len": 4096}, "env": {"A": "b"},
               "sim": {"gpu": "a100-80gb", "speedup": 10}},
    "workload": {"requests": {"count": 4, "prompt_tokens": "100-200", "output_tokens": 8},
                 "arrivals": {"kind": "concurrency", "concurrency": 2}, "warmup_requests": 0},
    "search_space": {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 4096, "log": True}},
    "oom_threshold": {"fraction": 0.97},
    "slos": {"ttft_p95_s": 10.0},
    "budget": {"trials": 1},
}
GPU = {"name": "fuzz-gpu", "memory_gib": 24, "bandwidth_gbps": 900, "fp16_tflops": 80, "pcie_gbps": 32,
       "nvlink_gbps": 0}
MODEL = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512,
         "vocab_size": 1000, "max_position_embeddings": 8192, "torch_dtype": "float16"}
DAEMON = {"scenario": "scenario.yaml", "production": {"endpoint": "http://127.0.0.1:9"},
          "deploy": {"kind": "file", "config_path": "tuned.yaml"},
          "triggers": {"poll_interval_s": 30, "schedule": {"every": "7d"}}, "min_interval_s": "1h",
          "tune": {"trials": 2, "timeout": "10m", "confirm": "2x2", "soak": "0"}}

# Values that are wrong for every field of their kind (and the fields of that kind, with the lowest bound).
NAN, INF = float("nan"), float("inf")
BAD_INT = [True, False, 1.5, "x", NAN, INF, -INF, 10**30, 1e29, -5, [1], {"a": 1}, "", "9" * 400]
BAD_FLOAT = [True, NAN, INF, -INF, "x", -1, [], {"a": 1}, 1e300, 10**400]
INT_FIELDS = [("workload", "requests", "count"), ("workload", "arrivals", "concurrency"), ("budget", "trials"),
              ("engine", "sim", "gpus"), ("workload", "max_requests")]
FLOAT_FIELDS = [("engine", "startup_timeout_s"), ("engine", "sim", "speedup"), ("workload", "arrivals", "time_scale"),
                ("workload", "max_duration_s"), ("workload", "request_timeout_s"), ("slos", "ttft_p95_s"),
                ("oom_threshold", "fraction"), ("monitor", "hz")]
BAD_TEXT = {("name",): ["..", ".", ".hidden", "a/b", "a\0b", "x" * 300, "", "-x", "a b", 5, True, None],
            ("engine", "model"): ["x" * 5000, "", "a/" + "b" * 300, 5, None, ["m"]],
            ("engine", "kind"): ["tgi", "", 1, None],
            ("budget", "timeout"): ["forever", "9" * 400, "1e400h", "-1h", "", 5, True],
            ("storage",): ["", 5, ["x"]]}
BAD_ENV_NAMES = ["A=B", "A;rm -rf /", "1A", "A B", "A\nExecStartPre=/bin/sh", "", "A-B", "$A", "é"]


@dataclass
class Case:
    kind: str
    what: str
    files: dict[str, bytes]
    argv: list[str] = field(default_factory=list)


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return doc


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode("utf-8")


def _yaml_text_mutations(rng: random.Random, base: dict[str, Any]) -> list[tuple[str, bytes]]:
    """Whole-file mutations: each is invalid whatever the document (bad YAML, duplicate key, bomb, size)."""
    text = yaml.safe_dump(base, sort_keys=False)
    flow = yaml.safe_dump(base, default_flow_style=True, width=10**6).strip()
    bomb = "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9 if p else ['x'] * 9)}]\n"
                   for p, c in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg", strict=True))
    key = rng.choice(list(base))
    cut = rng.randrange(1, len(flow) - 1)
    return [
        ("duplicate top key", (text + f"{key}: {json.dumps(base[key])}\n").encode()),
        ("duplicate nested key", text.replace("engine:\n", "engine:\n  model: x\n", 1).encode()
         if "engine:\n" in text else (text + f"{key}: 1\n").encode()),
        ("alias bomb", (text + bomb).encode()),
        ("truncated flow", flow[:cut].encode()),
        ("over 1 MiB", (text + "#" * (1 << 20) + "\n").encode()),
        ("binary junk", bytes(rng.randrange(128, 256) for _ in range(rng.randrange(2, 200))) + b"\xff\xfe"),
        ("deep nesting", ("a: " + "[" * rng.randrange(2000, 20000)).encode()),
        ("tab indent", text.replace("\n", "\n\t", 1).encode()),
        ("top level list", b"- 1\n- 2\n"), ("top level scalar", rng.choice([b"42\n", b"~\n", b"", b"'x'\n"])),
        ("unknown key", (text + f"zz_{rng.randrange(10**6)}: 1\n").encode()),
    ]


def scenario_cases(rng: random.Random) -> list[Case]:
    out: list[tuple[str, bytes]] = []
    for path in INT_FIELDS:
        out += [(f"{'.'.join(path)}={v!r:.40}", _dump(_set(SCENARIO, path, v))) for v in BAD_INT]
    for path in FLOAT_FIELDS:
        out += [(f"{'.'.join(path)}={v!r:.40}", _dump(_set(SCENARIO, path, v))) for v in BAD_FLOAT]
    for path, values in BAD_TEXT.items():
        out += [(f"{'.'.join(path)}={v!r:.40}", _dump(_set(SCENARIO, path, v))) for v in values]
    for name in BAD_ENV_NAMES:
        out.append((f"engine.env name {name!r}", _dump(_set(SCENARIO, ("engine", "env"), {name: "x"}))))
    for dist in ({"kind": "lognormal", "median": 100, "sigma": 1e300}, {"kind": "lognormal", "median": INF, "sigma": 1},
                 {"kind": "normal", "mean": NAN, "stddev": 1}, {"kind": "uniform", "low": 9, "high": 1},
                 {"kind": "fixed"}, {"kind": "zipf", "value": 3}, "9-1", "99999999999999-1", True, -3):
        out.append((f"prompt_tokens={dist!r:.40}", _dump(_set(SCENARIO, ("workload", "requests", "prompt_tokens"),
                                                              dist))))
    for param in ({"type": "float", "low": NAN, "high": 0.9}, {"type": "float", "low": 0.5, "high": INF},
                  {"type": "int", "low": 10, "high": 1}, {"type": "int"}, {"type": "categorical", "choices": []},
                  {"type": "int", "low": 0, "high": 9, "log": True}, {"type": "zz", "low": 1, "high": 2}):
        out.append((f"search_space={param!r:.40}", _dump(_set(SCENARIO, ("search_space", "gpu-memory-utilization"),
                                                              param))))
    for section in ("engine", "workload", "budget", "monitor", "slos", "search_space", "objectives"):
        out.append((f"{section} is text", _dump(_set(SCENARIO, (section,), "text"))))
    out.append(("engine missing", _dump({k: v for k, v in SCENARIO.items() if k != "engine"})))
    out.append(("virtual with a trace", _dump(_set(SCENARIO, ("workload", "requests"), {"kind": "trace",
                                                                                       "path": "t.jsonl"}))))
    out += _yaml_text_mutations(rng, SCENARIO)
    cases = []
    for what, data in out:
        command = rng.choice(["tune", "doctor", "measure"])
        files = {"scenario.yaml": data}
        if what == "virtual with a trace":
            files["t.jsonl"] = b'{"prompt": "a", "max_tokens": 3}\n'
        cases.append(Case("scenario", what, files, [command, "scenario.yaml"]))
    return cases


def trace_cases(rng: random.Random) -> list[Case]:
    good = {"prompt": "hello", "max_tokens": 4, "arrival_s": 0.5}
    bad_lines = ["{", "[1, 2]", "42", '"text"', "null", json.dumps({"max_tokens": 3}),
                 json.dumps({"prompt": "", "max_tokens": 3}), json.dumps({"prompt": 5, "max_tokens": 3}),
                 json.dumps({"prompt": "a", "messages": [], "max_tokens": 3}),
                 json.dumps({"messages": [], "max_tokens": 3}), json.dumps({"messages": [1], "max_tokens": 3}),
                 json.dumps({"messages": [{"content": "x"}], "max_tokens": 3}),
                 '{"prompt": "a", "max_tokens": 3, "arrival_s": NaN}', '{"prompt": "a", "max_tokens": 3, "arrival_s": '
                 'Infinity}', json.dumps({"prompt": "a", "max_tokens": 3, "arrival_s": -1})]
    bad_lines += [json.dumps({"prompt": "a", "max_tokens": v}) for v in (0, -1, True, 1.5, "3", None, [3])]
    bad_lines += ["[" * 100000, "\x00", '{"prompt": "a", "max_tokens": 3}' + "x"]
    cases = []
    for line in bad_lines:
        for _ in range(2):
            lines = [json.dumps(good)] * rng.randrange(0, 4)
            lines.insert(rng.randrange(0, len(lines) + 1), line)
            cases.append(_trace_case(f"line {line[:40]!r}", "\n".join(lines).encode(), arrival="trace"))
    cases.append(_trace_case("no arrival_s for trace arrivals", json.dumps({"prompt": "a", "max_tokens": 3}).encode(),
                             arrival="trace"))
    for junk in (b"", b"\n\n  \n", b"\xff\xfe\x00", bytes(rng.randrange(256) for _ in range(300)) + b"\xff"):
        cases.append(_trace_case(f"file {junk[:20]!r}", junk, arrival="concurrency"))
    return cases


def _trace_case(what: str, data: bytes, arrival: str) -> Case:
    doc = _set(SCENARIO, ("engine", "kind"), "sim")
    doc = _set(doc, ("workload", "requests"), {"kind": "trace", "path": "trace.jsonl"})
    doc = _set(doc, ("workload", "arrivals"), {"kind": arrival})
    return Case("trace", what, {"scenario.yaml": _dump(doc), "trace.jsonl": data}, ["doctor", "scenario.yaml"])


def gpu_cases(rng: random.Random) -> list[Case]:
    docs: list[tuple[str, bytes]] = []
    for key in GPU:
        if key == "name":
            docs += [(f"name={v!r}", _dump(_set(GPU, (key,), v))) for v in (5, [], "", None)]
            continue
        low = -1 if key == "nvlink_gbps" else 0
        docs += [(f"{key}={v!r:.30}", _dump(_set(GPU, (key,), v))) for v in (low, "fast", True, NAN, INF, 1e30, [])]
        docs.append((f"missing {key}", _dump({k: v for k, v in GPU.items() if k != key})))
    docs += _yaml_text_mutations(rng, GPU)
    doc = _set(SCENARIO, ("engine", "sim", "gpu"), "gpu.yaml")
    return [Case("gpu", what, {"scenario.yaml": _dump(doc), "gpu.yaml": data}, [rng.choice(["tune", "doctor"]),
                                                                              "scenario.yaml"]) for what, data in docs]


def model_cases(rng: random.Random) -> list[Case]:
    docs: list[tuple[str, bytes]] = []
    for key in MODEL:
        values = ["x", ["x"], {"a": 1}] if key == "torch_dtype" else [0, -1, "x", True, 1.5, [], NAN, 10**30]
        docs += [(f"{key}={v!r:.30}", json.dumps(_set(MODEL, (key,), v)).encode()) for v in values]
    docs += [("heads > width", json.dumps({**MODEL, "num_attention_heads": 512}).encode()),
             ("rope factor text", json.dumps({**MODEL, "rope_scaling": {"type": "linear", "factor": "x"}}).encode()),
             ("text_config list", json.dumps({**MODEL, "text_config": [1]}).encode()),
             ("array", b"[1, 2]"), ("not json", b"{hidden_size: 1"), ("empty", b""), ("binary", b"\xff\x00\xfe"),
             ("deep", b"[" * 100000), ("truncated", json.dumps(MODEL).encode()[:rng.randrange(1, 60)])]
    doc = _set(SCENARIO, ("engine", "model"), "model")
    return [Case("model", what, {"scenario.yaml": _dump(doc), "model/config.json": data},
                 [rng.choice(["tune", "doctor"]), "scenario.yaml"]) for what, data in docs]


def daemon_cases(rng: random.Random) -> list[Case]:
    docs: list[tuple[str, bytes]] = []
    for path, values in {
        ("production", "endpoint"): ["http://a b", "ftp://x", "", "http://", 5, "http://x/\n", "x" * 5000],
        ("production", "api_key_env"): ["A B", "1A", "A=B", ""],
        ("triggers", "poll_interval_s"): [INF, NAN, "9" * 400, -1, "abc", [], "1e400s"],
        ("min_interval_s",): [INF, "9" * 400, -1, "forever"],
        ("triggers", "schedule", "every"): ["0s", INF, "x", "9" * 400],
        ("tune", "timeout"): ["forever", "9" * 400], ("tune", "trials"): [0, -1, "x"],
        ("tune", "confirm"): ["0", "x", "3x"], ("tune", "policy"): ["nope"],
        ("window",): ["25:00-01:00", "01:00-01:00", "x", 5],
        ("approve",): ["maybe", ""], ("listen", "port"): [70000, -1, "x"],
        ("listen", "host"): ["203.0.113.7", "", "no such host.invalid", "x" * 300],
        ("listen", "token_env"): ["A B", ""], ("scenario",): ["missing.yaml", 5],
        ("max_downtime",): ["0s", "forever"], ("deploy", "kind"): ["nope", 5],
    }.items():
        docs += [(f"{'.'.join(path)}={v!r:.40}", _dump(_set(DAEMON, path, v))) for v in values]
    for start in ([""], ["", "x"], [" "], [], "systemctl restart vllm", [None], [True]):
        command = {"kind": "command", "start": start, "stop": ["true"], "config_path": "tuned.yaml"}
        docs.append((f"deploy.start={start!r}", _dump(_set(DAEMON, ("deploy",), command))))
    docs += _yaml_text_mutations(rng, DAEMON)
    return [Case("daemon", what, {"daemon.yaml": data, "scenario.yaml": _dump(SCENARIO)}, ["daemon", "plan",
                                                                                           "daemon.yaml"])
            for what, data in docs]


def set_cases(rng: random.Random) -> list[Case]:
    items = ["novalue", "=1", "port=1", "host=0.0.0.0", "model=x", "max-num-seqs=1.5", "max-num-seqs=true",
             "max-num-seqs=x", "max-num-seqs=nan", "gpu-memory-utilization=nan", "gpu-memory-utilization=inf",
             "gpu-memory-utilization=-inf", "cpu-offload-gb=nan", "cpu-offload-gb=x", "foo-bar=nan", "foo-bar=inf",
             "foo-bar=" + "9" * 400, "enable-chunked-prefill=maybe", "kv-cache-dtype=nope", "x" * 5000 + "=1",
             "Max Num Seqs=3", "block-size=", "tensor-parallel-size=0.5"]
    return [Case("set", f"--set {item[:40]!r}", {"scenario.yaml": _dump(SCENARIO)},
                 ["measure", "scenario.yaml", "--set", item]) for item in items]


def generate(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    groups = [scenario_cases(rng), trace_cases(rng), gpu_cases(rng), model_cases(rng), daemon_cases(rng),
              set_cases(rng)]
    cases = [c for g in groups for c in g]
    rng.shuffle(cases)
    while len(cases) < n:  # more: the same mutations of another seed's choices (other cuts, junk, commands)
        more = [c for g in (scenario_cases(rng), trace_cases(rng), gpu_cases(rng), daemon_cases(rng)) for c in g]
        cases += rng.sample(more, min(len(more), n - len(cases)))
    return cases[:n]


def base_cases() -> list[Case]:
    """The unmutated documents each family mutates, run the same way: they must pass (exit 0), else every
    mutation of that family would be refused for the base's fault and prove nothing."""
    command = {"kind": "command", "start": ["true"], "stop": ["true"], "config_path": "tuned.yaml"}
    return [
        Case("scenario", "base", {"scenario.yaml": _dump(SCENARIO)}, ["doctor", "scenario.yaml"]),
        Case("set", "base", {"scenario.yaml": _dump(SCENARIO)}, ["measure", "scenario.yaml", "--set",
                                                                 "max-num-seqs=8"]),
        Case("gpu", "base", {"scenario.yaml": _dump(_set(SCENARIO, ("engine", "sim", "gpu"), "gpu.yaml")),
                             "gpu.yaml": _dump(GPU)}, ["doctor", "scenario.yaml"]),
        Case("model", "base", {"scenario.yaml": _dump(_set(SCENARIO, ("engine", "model"), "model")),
                               "model/config.json": json.dumps(MODEL).encode()}, ["doctor", "scenario.yaml"]),
        _trace_case("base", b'{"prompt": "a", "max_tokens": 3, "arrival_s": 0}\n', arrival="trace"),
        Case("daemon", "base", {"daemon.yaml": _dump(DAEMON), "scenario.yaml": _dump(SCENARIO)},
             ["daemon", "plan", "daemon.yaml"]),
        Case("daemon", "base command", {"daemon.yaml": _dump(_set(DAEMON, ("deploy",), command)),
                                        "scenario.yaml": _dump(SCENARIO)}, ["daemon", "plan", "daemon.yaml"]),
    ]


# --- running -------------------------------------------------------------------------------------------

def _prepare(case: Case, scratch: Path) -> tuple[set[Path], dict[str, str], list[str]]:
    """The case's files written into `scratch`; what was there, the environment and the argv to run."""
    for name, data in case.files.items():
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_bytes(data)
    argv = list(case.argv)
    if argv and argv[0] == "tune":
        argv += ["--storage", str(scratch / "study.db"), "--confirm", "0"]
    env = {"AUTOTUNER_HOME": str(scratch / "home"), "AUTOTUNER_SIM_STATE_DIR": str(scratch / "simstate")}
    return set(scratch.rglob("*")), env, argv


def _outcome(case: Case, argv: list[str], scratch: Path, before: set[Path], code: int | None, output: str,
             traceback: bool) -> dict[str, Any]:
    left = sorted(str(p.relative_to(scratch)) for p in set(scratch.rglob("*")) - before)
    return {"kind": case.kind, "what": case.what, "argv": argv, "exit": code, "traceback": traceback
            or "Traceback (most recent call last)" in output, "files_left": left, "output": output[-300:]}


class CaseTimeout(BaseException):
    """A case ran past its time (a count of 1e29 once hung `tune`): a wrong outcome, not a traceback."""


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def run_in_process(case: Case, work: Path, timeout_s: int = 60) -> dict[str, Any]:
    from typer.testing import CliRunner

    from autotuner.cli.app import app

    scratch = Path(tempfile.mkdtemp(dir=work))
    before, env, argv = _prepare(case, scratch)
    os.environ.update(env)
    os.chdir(scratch)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    try:
        result = CliRunner().invoke(app, argv, catch_exceptions=True)
        code, output = result.exit_code, result.output
        traceback = result.exception is not None and not isinstance(result.exception, SystemExit)
        if traceback:
            output += f"\n{type(result.exception).__name__}: {result.exception}"
    except CaseTimeout:
        code, output, traceback = None, f"timed out after {timeout_s} s", False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return _outcome(case, argv, scratch, before, code, output, traceback)


def run_subprocess(case: Case, work: Path, timeout_s: float = 60) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(dir=work))
    before, env, argv = _prepare(case, scratch)
    try:
        proc = subprocess.run([sys.executable, "-m", "autotuner", *argv], cwd=scratch, capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, **env, "PYTHONPATH": str(REPO)})
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        code, output = None, "timed out"
    return _outcome(case, argv, scratch, before, code, output, False)


def _limit_memory() -> None:
    """Each worker at most 4 GiB: an input that still made the loader balloon (the alias bomb took 9 GB before
    its cap) is a MemoryError counted as a traceback, not a machine brought down."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _batch(args: tuple[list[Case], str]) -> list[dict[str, Any]]:
    cases, work = args
    return [run_in_process(c, Path(work)) for c in cases]


# --- the daemon's HTTP surface -------------------------------------------------------------------------

HTTP_TOKEN_ENV = "AUTOTUNER_FUZZ_TOKEN"


def serve(port_file: Path) -> None:
    """The daemon's endpoint (its app and guarded server) over a real study database, until killed."""
    from prometheus_client import CollectorRegistry

    from autotuner.daemon.http import DaemonCollector, DaemonServer, build_app
    from autotuner.daemon.state import CycleStore
    from autotuner.store.db import Store

    os.environ[HTTP_TOKEN_ENV] = "fuzz-token-0123456789"
    states = CycleStore(Store(str(port_file.parent / "d.db")), "fuzz")
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DaemonCollector(states, lambda: "idle"))

    async def main() -> None:
        server = DaemonServer(build_app(lambda: {"state": "idle"}, registry, HTTP_TOKEN_ENV), "127.0.0.1", 0,
                              header_timeout_s=1.0)
        port = await server.start()
        port_file.write_text(str(port))
        await asyncio.Event().wait()

    asyncio.run(main())


def http_requests(rng: random.Random, n: int) -> list[bytes]:
    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT", "PATCH", "GE T", "get", "X" * 300]
    paths = ["/status", "/metrics", "/healthz", "/status/", "/../etc/passwd", "//status", "/%00", "/%ff%fe", "*",
             "/" + "a" * 10000, "/status?x=" + "%" * 50, "http://evil.example/status", "/\u00e9".encode().decode(),
             "/metrics#x", ""]
    auths = ["", "Bearer ", "Bearer wrong", "Bearer fuzz-token-012345678", "bearer fuzz-token-0123456789",
             "Basic Zm9vOmJhcg==", "Bearer " + "x" * 9000, "Bearer \x00", "Bearer fuzz-token-0123456789\xff"]
    out = []
    for _ in range(n):
        shape = rng.randrange(6)
        method, path = rng.choice(methods), rng.choice(paths)
        version = rng.choice(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", "", "HTTP/1.1 x"])
        headers = [f"Host: {rng.choice(['127.0.0.1', 'evil.example', '', 'x' * 500])}"]
        auth = rng.choice(auths)
        if auth:
            headers.append(f"Authorization: {auth}")
        if shape == 1:
            headers.append("X-Big: " + "y" * rng.choice([9000, 70000, 200000]))
        elif shape == 2:
            headers += [f"X-{i}: {i}" for i in range(rng.choice([200, 2000]))]
        elif shape == 3:
            headers.append(f"Content-Length: {rng.choice(['-1', 'x', '99999999999', '5'])}")
        elif shape == 4:
            headers.append("Transfer-Encoding: chunked")
        line = f"{method} {path} {version}".encode("utf-8", "surrogateescape")
        raw = line + b"\r\n" + "\r\n".join(headers).encode("latin-1", "replace") + b"\r\n\r\n"
        if shape == 5:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        elif shape == 4:
            raw += b"zz\r\nnot hex\r\n0\r\n\r\n"
        out.append(raw)
    return out


def _send(port: int, raw: bytes) -> int | None:
    """The status code answered (None: no answer, the connection was closed: a refusal, not an error)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            data = sock.recv(64)
        except OSError:
            return None
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else None


def run_http(work: Path, seed: int, n: int) -> list[dict[str, Any]]:
    scratch = Path(tempfile.mkdtemp(dir=work))
    port_file = scratch / "port"
    log = (scratch / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(port_file)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    results = []
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fuzz endpoint did not start: {(scratch / 'server.log').read_text()[-500:]}")
            time.sleep(0.05)
        port = int(port_file.read_text())
        for i, raw in enumerate(http_requests(random.Random(seed), n)):
            status = _send(port, raw)
            alive = _send(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == 200
            results.append({"kind": "http", "what": repr(raw[:60]), "status": status, "alive": alive, "index": i})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    server_log = (scratch / "server.log").read_text()
    for r in results:
        r["traceback"] = "Traceback" in server_log
        r["exit"] = 2 if (r["status"] is None or r["status"] < 500) and r["alive"] else r["status"]
        r["files_left"] = []
    if "Traceback" in server_log:
        results[-1]["output"] = server_log[-1000:]
    return results


# --- the corpus ------------------------------------------------------------------------------------------

def run_fuzz(work: Path, seed: int = 0, n: int = 1000, http_n: int = 150, workers: int | None = None,
             subprocess_sample: int = 8) -> dict[str, Any]:
    """The corpus: `n` file and flag cases plus `http_n` requests; the counts (and the failures, to look at)."""
    work.mkdir(parents=True, exist_ok=True)
    for base in base_cases():
        outcome = run_in_process(base, work)
        if outcome["exit"] != 0:
            raise RuntimeError(f"the fuzz's valid {base.kind} document is refused, so its mutations prove nothing: "
                               f"{outcome['output']}")
    cases = generate(seed, n - http_n)
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    chunks = [cases[i::workers * 4] for i in range(workers * 4)]
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(workers, initializer=_limit_memory) as pool:
        for batch in pool.map(_batch, [(c, str(work)) for c in chunks]):
            results += batch
    sample = random.Random(seed).sample(cases, min(subprocess_sample, len(cases)))
    for case in sample:  # the CLI as a user runs it must agree with the in-process run
        sub = run_subprocess(case, work)
        sub["what"] += " (subprocess)"
        results.append(sub)
    results += run_http(work, seed, http_n)
    bad = [r for r in results if r["traceback"] or r["exit"] != 2 or r["files_left"]]
    return {"fuzz_tried": len(results), "fuzz_tracebacks": sum(bool(r["traceback"]) for r in results),
            "fuzz_wrong_exit": sum(r["exit"] != 2 for r in results),
            "fuzz_files_left": sum(bool(r["files_left"]) for r in results), "failures": bad}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--show", type=int, default=20, help="failures to print")
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="autotuner-fuzz-"))
    counts = run_fuzz(work, args.seed, args.n)
    for r in counts.pop("failures")[:args.show]:
        print(json.dumps(r, default=str)[:600])
    print(" ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
