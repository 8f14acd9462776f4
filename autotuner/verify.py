"""`autotuner verify`: check an endpoint that is already running (directly or through a gateway) with
the seed's verification — concurrent long prompts — and say what is wrong in words a user can act on.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from autotuner.errors import UserInputError
from autotuner.monitor import MemorySummary, Sampler
from autotuner.monitor.base import MemoryMonitor, MonitorConfigError
from autotuner.monitor.factory import open_monitor
from autotuner.scenario import LengthSettings, Scenario, WorkloadSettings
from autotuner.workload.client import RequestResult, StreamingClient, http_client
from autotuner.workload.proxies import through_proxy
from autotuner.workload.replay import replay
from autotuner.workload.requests import build_requests, fresh_replay
from autotuner.workload.summary import summarize

# The seed's check: 8 concurrent prompts of several thousand tokens.
SEED_CHECK = WorkloadSettings.model_validate({
    "requests": {"count": 8, "prompt_tokens": {"kind": "uniform", "low": 3000, "high": 6000},
                 "output_tokens": 64},
    "arrivals": {"kind": "concurrency", "concurrency": 8},
    "warmup_requests": 0,
    "request_timeout_s": 300,
})


# What a proxy answers when it could not reach (or be allowed to reach) the endpoint behind it.
_PROXY_STATUSES = (403, 407, 502, 503, 504)
# Room left for what the server adds to a prompt (BOS, chat template) beyond the counted tokens.
CONTEXT_MARGIN_TOKENS = 16


@dataclass
class Verdict:
    ok: bool
    problems: list[str] = field(default_factory=list)
    metrics: dict[str, float | int | None] = field(default_factory=dict)
    memory: MemorySummary | None = None
    model: str | None = None
    notes: list[str] = field(default_factory=list)  # what verify adapted, e.g. prompts fitted to the context


def _largest(length: LengthSettings) -> int | None:
    """The longest a length distribution can draw (None: unbounded)."""
    if length.kind == "fixed":
        return min(length.value or 1, length.max or length.value or 1)
    if length.kind == "uniform":
        return min(length.high or 1, length.max or length.high or 1)
    return length.max


def _capped(length: LengthSettings, cap: int) -> LengthSettings:
    data = length.model_dump()
    if length.kind == "fixed":
        data["value"] = min(length.value or 1, cap)
    elif length.kind == "uniform":
        data["high"] = min(length.high or 1, cap)
        data["low"] = min(length.low or 1, data["high"])
    data["max"] = min(length.max or cap, cap)
    data["min"] = min(length.min, data["max"])
    return LengthSettings.model_validate(data)


def fit_to_context(workload: WorkloadSettings, max_model_len: int) -> tuple[WorkloadSettings, str | None]:
    """Synthetic prompts cut so that prompt + output ≤ the served context (`max_model_len`), with a
    sentence saying so; unchanged (and None) when they already fit or the workload is a trace."""
    requests = workload.requests
    if requests.kind != "synthetic":
        return workload, None
    output, prompt = requests.output_tokens, requests.prompt_tokens
    out_max = _largest(output)
    if out_max is None or out_max > max_model_len // 2:
        out_max = max(1, min(out_max or max_model_len, max_model_len // 8))
        output = _capped(output, out_max)
    cap = max(1, max_model_len - out_max - CONTEXT_MARGIN_TOKENS)
    prompt_max = _largest(prompt)
    if prompt_max is not None and prompt_max <= cap and output is requests.output_tokens:
        return workload, None
    fitted = requests.model_copy(update={"prompt_tokens": _capped(prompt, cap), "output_tokens": output})
    note = (f"the server's context is {max_model_len} tokens (max_model_len from /v1/models): prompts fitted "
            f"to at most {cap} tokens and outputs to at most {out_max}, so that prompt + output fits")
    return workload.model_copy(update={"requests": fitted}), note


def _check_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserInputError(f"--base-url {base_url!r}: expected http(s)://HOST[:PORT], e.g. http://127.0.0.1:8000")
    return base_url.rstrip("/").removesuffix("/v1")


def _refused(exc: BaseException) -> bool:
    """httpx hides the errno ("All connection attempts failed"): look down the exception chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unreachable(base_url: str, exc: Exception) -> str:
    what = "could not be reached" if isinstance(exc, httpx.ConnectError) else "failed"
    via = through_proxy(base_url, f"{what} ({type(exc).__name__}: {exc})")
    if via is not None:
        return f"cannot reach {base_url}: {via}."
    host = urlsplit(base_url).hostname or ""
    hint = ""
    if host in ("127.0.0.1", "localhost", "::1"):
        hint = (" Inside a container, 127.0.0.1 is the container itself: use the service name or "
                "host.docker.internal, and make vLLM listen on 0.0.0.0 (--host).")
    if isinstance(exc, httpx.ConnectError) and _refused(exc):
        return f"cannot reach {base_url}: connection refused — nothing listens there. Is the server " \
               f"running, and are host and port right?{hint}"
    if isinstance(exc, httpx.TimeoutException):
        return f"cannot reach {base_url}: timed out connecting — a firewall, a wrong host, or a server " \
               "still starting."
    return f"cannot reach {base_url}: {type(exc).__name__}: {exc}.{hint}"


async def _models(http: httpx.AsyncClient, base_url: str, headers: dict[str, str], key_env: str | None,
                  problems: list[str]) -> dict[str, int | None] | None:
    """Served model names and each one's context length (vLLM's `max_model_len`; None if not given)."""
    try:
        r = await http.get(base_url + "/v1/models", headers=headers, timeout=15)
    except httpx.HTTPError as exc:
        problems.append(_unreachable(base_url, exc))
        return None
    if r.status_code == 401:
        if headers:
            problems.append(f"401 Unauthorized: the server rejected the API key from ${key_env}. Check that it "
                            "matches the server's --api-key (or the gateway's key).")
        else:
            hint = f"${key_env} is not set" if key_env else "no key was given"
            problems.append(f"401 Unauthorized: the server needs an API key and {hint}. Put the key in an "
                            "environment variable and pass its name with --api-key-env.")
        return None
    if r.status_code != 200:
        via = through_proxy(base_url, f"answered {r.status_code}")
        problems.append(f"GET /v1/models: {via}." if via is not None and r.status_code in _PROXY_STATUSES
                        else f"GET /v1/models answered HTTP {r.status_code}: {r.text[:200]}")
        return None
    try:
        data = r.json().get("data", [])
        return {str(m["id"]): _context_length(m) for m in data}
    except (ValueError, AttributeError, KeyError, TypeError):
        problems.append("GET /v1/models did not answer an OpenAI model list: is this an OpenAI-compatible "
                        "server (or a gateway route to one)?")
        return None


def _context_length(entry: dict[str, object]) -> int | None:
    value = entry.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _explain(results: list[RequestResult], model: str, served: list[str], key_env: str | None) -> list[str]:
    problems: list[str] = []
    failed = [r for r in results if not r.ok]
    if not failed:
        return problems
    first = failed[0]
    error = first.error or "unknown error"
    if first.status == 404:
        problems.append(f"404: the server does not serve a model named {model!r}; it serves "
                        f"{', '.join(served) or 'nothing'}. Pass --model with one of those.")
    elif first.status == 401:
        problems.append(f"401 Unauthorized on completions: check ${key_env or 'the API key variable'}.")
    elif "choices" in error:
        problems.append("responses came back without `choices`: the endpoint (or a gateway in front of it) "
                        f"does not speak the OpenAI completions format. First error: {error}")
    elif "timed out" in error.lower() or "timeout" in error.lower():
        problems.append(f"requests timed out: the server is overloaded or stuck. First error: {error}")
    else:
        problems.append(f"{len(failed)} of {len(results)} requests failed. First error: {error}")
    return problems


async def verify(base_url: str, model: str | None, key_env: str | None, scenario: Scenario | None,
                 monitor: MemoryMonitor | None) -> Verdict:
    base_url = _check_url(base_url)
    key = os.environ.get(key_env) if key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    problems: list[str] = []
    workload = scenario.workload if scenario is not None else SEED_CHECK
    async with http_client(trust_env=True) as http:  # the user's endpoint: their proxy settings apply
        contexts = await _models(http, base_url, headers, key_env, problems)
        if contexts is None:
            return Verdict(False, problems)
        served = list(contexts)
        if model is None:
            if len(served) != 1:
                return Verdict(False, [f"the server serves {', '.join(served) or 'no model'}; pick one with --model"])
            model = served[0]
        elif model not in served:
            return Verdict(False, [f"the server does not serve a model named {model!r}; it serves "
                                   f"{', '.join(served)}. Pass --model with one of those."], model=model)
        notes: list[str] = []
        context = contexts[model]
        if context is not None:
            workload, note = fit_to_context(workload, context)
            notes += [note] if note else []
        spec = workload.to_spec(scenario.source.parent if scenario and scenario.source else None)
        # Prompts of their own each call: a second verify of a running server would otherwise find the
        # first one's KV blocks in its prefix cache, prefill nothing and pass what it should test.
        request_set = await build_requests(spec, http, base_url, model, key, replay=fresh_replay())
        client = StreamingClient(http, base_url, model, key, ignore_eos=spec.ignore_eos,
                                 timeout_s=spec.request_timeout_s)
        sampler = Sampler(monitor, hz=100) if monitor is not None else None
        if sampler is not None:
            sampler.start()
        try:
            result = await replay(spec, request_set.requests, client)
        finally:
            memory = sampler.stop() if sampler is not None else None
    problems += request_set.warnings
    problems += _explain(result.results, model, served, key_env)
    ok = all(r.ok for r in result.results) and bool(result.results)
    return Verdict(ok, problems, summarize(result.results, result.duration_s), memory, model, notes)


def local_monitor() -> MemoryMonitor | None:
    """Real NVML when this machine has GPUs; nothing otherwise (verify then skips memory)."""
    try:
        return open_monitor("nvml", None)
    except MonitorConfigError:
        return None


def run_verify(base_url: str, model: str | None, key_env: str | None, scenario: Scenario | None) -> Verdict:
    monitor = local_monitor()
    try:
        return asyncio.run(verify(base_url, model, key_env, scenario, monitor))
    finally:
        if monitor is not None:
            monitor.close()
