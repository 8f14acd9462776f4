"""Read a running vLLM's OpenAI server: `/v1/models`, `/version` and `/metrics`, in one snapshot.

Never raises for an endpoint that is down or answers badly: the snapshot says `reachable=False` and
why. The API key is read from the environment variable the caller names and sent as a Bearer token;
it appears in no error text or log.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable
from typing import Any

import httpx

from autotuner.errors import AutotunerError
from autotuner.vllm import metrics as names
from autotuner.watch.fingerprint import model_fingerprint
from autotuner.watch.snapshot import LengthHistogram, ProductionSnapshot
from autotuner.workload import prometheus


class ProbeError(AutotunerError):
    """One endpoint answered in a way we cannot read (the message never holds the API key)."""


async def probe(endpoint: str, *, api_key_env: str | None = None, timeout_s: float = 5.0) -> ProductionSnapshot:
    base = endpoint.rstrip("/")
    headers: dict[str, str] = {}
    if api_key_env and (key := os.environ.get(api_key_env)):
        headers["Authorization"] = f"Bearer {key}"
    taken_at = time.time()
    empty = {"served_model": None, "root": None, "max_model_len": None, "vllm_version": None,
             "model_fingerprint": None, "prompt_tokens": None, "generation_tokens": None,
             "kv_cache_usage": None, "preemptions_total": None, "requests_running": None}
    # trust_env=False: production is usually on 127.0.0.1, which a corporate HTTP(S)_PROXY must not see.
    try:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout_s, trust_env=False) as http:
            models, version, metrics_text = await asyncio.gather(
                _get_json(http, "/v1/models", api_key_env), _get_json(http, "/version", None),
                _get_text(http, "/metrics"), return_exceptions=True)
    except httpx.InvalidURL as exc:
        return ProductionSnapshot(taken_at=taken_at, endpoint=base, reachable=False,
                                  error=f"{endpoint!r} is not a URL: {exc}", **empty)
    # /v1/models says which model is served: without it the rest cannot be attributed to a deployment.
    if isinstance(models, BaseException):
        if not isinstance(models, ProbeError):
            raise models
        return ProductionSnapshot(taken_at=taken_at, endpoint=base, reachable=False, error=str(models), **empty)
    problems: list[str] = []
    if isinstance(version, BaseException):
        if not isinstance(version, ProbeError):
            raise version
        problems.append(str(version))
        version = {}
    scraped = prometheus.parse("")  # nothing scraped
    if isinstance(metrics_text, BaseException):
        if not isinstance(metrics_text, ProbeError):
            raise metrics_text
        problems.append(str(metrics_text))
    else:
        try:
            scraped = prometheus.parse(metrics_text)
        except prometheus.MetricsParseError as exc:
            problems.append(f"/metrics is not Prometheus text: {exc}")
    error = "; ".join(problems) or None
    model = _first_model(models)
    served = _str(model.get("id"))
    root = _str(model.get("root"))
    max_len = model.get("max_model_len")
    return ProductionSnapshot(
        taken_at=taken_at, endpoint=base, reachable=True, error=error,
        served_model=served, root=root,
        max_model_len=int(max_len) if isinstance(max_len, int | float) and not isinstance(max_len, bool) else None,
        vllm_version=_str(version.get("version")),
        model_fingerprint=model_fingerprint(root, served),
        prompt_tokens=length_histogram(scraped, names.REQUEST_PROMPT_TOKENS),
        generation_tokens=length_histogram(scraped, names.REQUEST_GENERATION_TOKENS),
        kv_cache_usage=scraped.largest(names.KV_CACHE_USAGE),
        preemptions_total=scraped.get(names.counter_sample(names.NUM_PREEMPTIONS)),
        requests_running=scraped.get(names.NUM_REQUESTS_RUNNING),
        simulator=sim if isinstance(sim := version.get("simulator"), dict) else None,
        ttft_s=length_histogram(scraped, names.TIME_TO_FIRST_TOKEN),
        itl_s=length_histogram(scraped, names.INTER_TOKEN_LATENCY),
    )


def length_histogram(scraped: prometheus.Snapshot, name: str) -> LengthHistogram | None:
    """The histogram `name` summed over its label sets (engines, models), always with a +Inf bucket;
    None if it is not exposed."""
    hist = scraped.histogram(name)
    if hist is None:
        return None
    buckets = dict(hist.buckets)
    buckets.setdefault(math.inf, hist.count)
    return LengthHistogram(tuple(sorted(buckets.items())), hist.count, hist.sum)


async def _get(http: httpx.AsyncClient, path: str) -> httpx.Response:
    try:
        resp = await http.get(path)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ProbeError(f"GET {http.base_url}{path}: {type(exc).__name__}: {exc or 'no answer'}") from None
    return resp


async def _get_json(http: httpx.AsyncClient, path: str, api_key_env: str | None) -> dict[str, Any]:
    resp = await _get(http, path)
    if resp.status_code == 401:
        hint = (f"is ${api_key_env} the server's --api-key?" if api_key_env
                else "the server wants an API key: pass --api-key-env VAR naming the variable that holds it")
        raise ProbeError(f"GET {http.base_url}{path} → HTTP 401 Unauthorized: {hint}")
    if resp.status_code != 200:
        raise ProbeError(f"GET {http.base_url}{path} → HTTP {resp.status_code}")
    try:
        body = resp.json()
    except ValueError:
        raise ProbeError(f"GET {http.base_url}{path}: the answer is not JSON (is this a vLLM server?)") from None
    if not isinstance(body, dict):
        raise ProbeError(f"GET {http.base_url}{path}: expected a JSON object")
    return body


async def _get_text(http: httpx.AsyncClient, path: str) -> str:
    resp = await _get(http, path)
    if resp.status_code != 200:
        raise ProbeError(f"GET {http.base_url}{path} → HTTP {resp.status_code}")
    return resp.text


def _first_model(models: dict[str, Any]) -> dict[str, Any]:
    data = models.get("data")
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        for item in data:
            if isinstance(item, dict):
                return item
    return {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
