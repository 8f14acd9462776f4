"""vLLM's `/metrics` (Prometheus text exposition): parse, diff two scrapes, poll during a replay.

Counters are diffed between a scrape before and one after the replay; gauges such as KV-cache usage
only mean something at an instant, so their peak needs polling while the load runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass

import httpx

from autotuner.vllm import metrics as names

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=\}))')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
SCRAPE_TIMEOUT_S = 5.0

PREEMPTIONS = names.counter_sample(names.NUM_PREEMPTIONS)
PROMPT_TOKENS = names.counter_sample(names.PROMPT_TOKENS)
GENERATION_TOKENS = names.counter_sample(names.GENERATION_TOKENS)
REQUEST_SUCCESS = names.counter_sample(names.REQUEST_SUCCESS)
KV_CACHE_USAGE = names.KV_CACHE_USAGE
RUNNING = names.NUM_REQUESTS_RUNNING
WAITING = names.NUM_REQUESTS_WAITING


class MetricsParseError(ValueError):
    pass


class ScrapeError(Exception):
    """/metrics could not be fetched or parsed (the engine may be down)."""


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    count: float
    sum: float


@dataclass(frozen=True)
class Snapshot:
    t: float  # perf_counter when scraped
    samples: dict[str, dict[Labels, float]]  # metric sample name → labels → value

    def get(self, name: str, **labels: str) -> float | None:
        """Sum over the samples of `name` whose labels include `labels`; None if there are none."""
        series = self.samples.get(name)
        if not series:
            return None
        want = set(labels.items())
        hits = [v for key, v in series.items() if want <= set(key)]
        return sum(hits) if hits else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in self.samples.get(name, {}).items():
            tag = dict(key).get(label)
            if tag is not None:
                out[tag] = out.get(tag, 0.0) + value
        return out

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        count = self.get(name + "_count", **labels)
        if count is None:
            return None
        by_le: dict[float, float] = {}
        want = set(labels.items())
        for key, value in self.samples.get(name + "_bucket", {}).items():
            tags = dict(key)
            if want <= set(key) and "le" in tags:
                le = float(tags["le"])
                by_le[le] = by_le.get(le, 0.0) + value
        return Histogram(tuple(sorted(by_le.items())), count, self.get(name + "_sum", **labels) or 0.0)


def parse(text: str, t: float | None = None) -> Snapshot:
    samples: dict[str, dict[Labels, float]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, labels, value = _parse_sample(line)
        except ValueError as exc:
            raise MetricsParseError(f"line {lineno}: {exc}: {line[:120]!r}") from None
        series = samples.setdefault(name, {})
        series[labels] = value
    return Snapshot(time.perf_counter() if t is None else t, samples)


def _parse_sample(line: str) -> tuple[str, Labels, float]:
    m = _NAME.match(line)
    if m is None:
        raise ValueError("no metric name")
    name, pos = m.group(), m.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] == " ":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL.match(line, pos)
            if lm is None:
                raise ValueError("bad label set")
            value = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group()], lm.group(2))
            labels.append((lm.group(1), value))
            pos = lm.end()
    parts = line[pos:].split()
    if not parts or len(parts) > 2:
        raise ValueError("expected a value and an optional timestamp")
    return name, tuple(sorted(labels)), float(parts[0])


@dataclass(frozen=True)
class MetricsDelta:
    """Counters as increases between two scrapes; gauges as read in the later one."""

    seconds: float
    preemptions: float
    prompt_tokens: float
    generation_tokens: float
    request_success: dict[str, float]  # by finished_reason
    kv_cache_usage_perc: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None


def _increase(before: float | None, after: float | None) -> float:
    if after is None:
        return 0.0
    if before is None or after < before:  # absent before, or the counter reset (engine restarted)
        return after
    return after - before


def delta(before: Snapshot, after: Snapshot) -> MetricsDelta:
    success_before = before.by_label(REQUEST_SUCCESS, "finished_reason")
    success = {reason: _increase(success_before.get(reason), n)
               for reason, n in after.by_label(REQUEST_SUCCESS, "finished_reason").items()}
    return MetricsDelta(
        seconds=after.t - before.t,
        preemptions=_increase(before.get(PREEMPTIONS), after.get(PREEMPTIONS)),
        prompt_tokens=_increase(before.get(PROMPT_TOKENS), after.get(PROMPT_TOKENS)),
        generation_tokens=_increase(before.get(GENERATION_TOKENS), after.get(GENERATION_TOKENS)),
        request_success=success,
        kv_cache_usage_perc=after.get(KV_CACHE_USAGE),
        num_requests_running=after.get(RUNNING),
        num_requests_waiting=after.get(WAITING),
    )


async def scrape(http: httpx.AsyncClient, base_url: str) -> Snapshot:
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = await http.get(url, timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"GET {url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ScrapeError(f"GET {url} → HTTP {resp.status_code}")
    try:
        return parse(resp.text)
    except MetricsParseError as exc:
        raise ScrapeError(f"GET {url}: {exc}") from None


async def poll(http: httpx.AsyncClient, base_url: str, interval_s: float, stop: asyncio.Event,
               into: list[Snapshot] | None = None) -> list[Snapshot]:
    """Scrape every `interval_s` until `stop` is set; failed scrapes are skipped (an engine that
    died mid-run must not take the poller down). Pass `into` to keep the snapshots if cancelled."""
    snapshots = [] if into is None else into
    while not stop.is_set():
        with contextlib.suppress(ScrapeError):
            snapshots.append(await scrape(http, base_url))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return snapshots


def peak(snapshots: list[Snapshot], name: str = KV_CACHE_USAGE) -> float | None:
    values = [v for s in snapshots if (v := s.get(name)) is not None]
    return max(values) if values else None
