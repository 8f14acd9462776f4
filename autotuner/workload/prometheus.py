"""vLLM's `/metrics` (Prometheus text exposition): parse, diff two scrapes, poll during a replay.

The one reader of `/metrics` in the project (the tuner's scrape and poll, the production watcher's
probe): prometheus_client's text parser, with each sample kept under its exposed name
(`vllm:prompt_tokens_total`, `…_bucket`, `…_count`) and label set.

Counters are diffed between a scrape before and one after the replay; gauges such as KV-cache usage
only mean something at an instant, so their peak needs polling while the load runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from functools import cached_property

import httpx
from prometheus_client.parser import text_string_to_metric_families

from autotuner.errors import AutotunerError
from autotuner.vllm import metrics as names

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs

SCRAPE_TIMEOUT_S = 5.0

PREEMPTIONS = names.counter_sample(names.NUM_PREEMPTIONS)
PROMPT_TOKENS = names.counter_sample(names.PROMPT_TOKENS)
GENERATION_TOKENS = names.counter_sample(names.GENERATION_TOKENS)
REQUEST_SUCCESS = names.counter_sample(names.REQUEST_SUCCESS)
KV_CACHE_USAGE = names.KV_CACHE_USAGE
RUNNING = names.NUM_REQUESTS_RUNNING
WAITING = names.NUM_REQUESTS_WAITING


class MetricsParseError(AutotunerError, ValueError):
    pass


class ScrapeError(AutotunerError):
    """/metrics could not be fetched or parsed (the engine may be down)."""


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    count: float
    sum: float


@dataclass(frozen=True)
class Snapshot:
    """One scrape: when, and the page; its samples are parsed on first read (`parse` reads them at once)."""

    t: float  # perf_counter when scraped
    page: str = field(default="", repr=False)

    @cached_property
    def samples(self) -> dict[str, dict[Labels, float]]:
        """Metric sample name → labels → value; `MetricsParseError` if the page is not Prometheus text."""
        return _samples(self.page)

    def get(self, name: str, **labels: str) -> float | None:
        """Sum over the samples of `name` whose labels include `labels`; None if there are none."""
        series = self.samples.get(name)
        if not series:
            return None
        want = set(labels.items())
        hits = [v for key, v in series.items() if want <= set(key)]
        return sum(hits) if hits else None

    def largest(self, name: str) -> float | None:
        """The largest sample of `name` over its label sets (a gauge read per engine); None if none."""
        series = self.samples.get(name)
        return max(series.values()) if series else None

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
    """Every sample of a text exposition; `MetricsParseError` names the first line that is not one."""
    snapshot = Snapshot(time.perf_counter() if t is None else t, text)
    snapshot.samples  # noqa: B018 - parsed now, so a bad page is an error here
    return snapshot


def _samples(text: str) -> dict[str, dict[Labels, float]]:
    lines = text.splitlines()
    for lineno, line in enumerate(lines, start=1):
        if _extra_fields(line):
            raise MetricsParseError(f"line {lineno}: expected a value and an optional timestamp: "
                                    f"{line.strip()[:120]!r}")
    samples: dict[str, dict[Labels, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = float(sample.value)
    except _PARSER_ERRORS as exc:
        lineno, line = _first_bad_line(lines)
        raise MetricsParseError(f"line {lineno}: {exc or 'not a sample'}: {line.strip()[:120]!r}") from None
    return samples


_PARSER_ERRORS = (ValueError, TypeError, IndexError)  # what prometheus_client's parser raises on bad text


def _extra_fields(line: str) -> bool:
    """More than a value and a timestamp after the sample's name and labels: prometheus_client's parser
    takes the last number for the timestamp, Prometheus refuses the line, and so do we."""
    text = line.strip()
    if not text or text.startswith("#"):
        return False
    _, brace, tail = text.rpartition("}")
    return len(tail.split() if brace else text.split()[1:]) > 2


def _first_bad_line(lines: list[str]) -> tuple[int, str]:
    """The line the parser stopped at (its errors name none): the first that does not parse alone."""
    for lineno, line in enumerate(lines, start=1):
        try:
            list(text_string_to_metric_families(line))
        except _PARSER_ERRORS:
            return lineno, line
    return len(lines), lines[-1] if lines else ""


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
    """/metrics now, parsed: a page that is not Prometheus text is a `ScrapeError`."""
    url, page = await _fetch(http, base_url)
    try:
        return parse(page)
    except MetricsParseError as exc:
        raise ScrapeError(f"GET {url}: {exc}") from None


async def _fetch(http: httpx.AsyncClient, base_url: str) -> tuple[str, str]:
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = await http.get(url, timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"GET {url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ScrapeError(f"GET {url} → HTTP {resp.status_code}")
    return url, resp.text


async def poll(http: httpx.AsyncClient, base_url: str, interval_s: float, stop: asyncio.Event,
               into: list[Snapshot] | None = None) -> list[Snapshot]:
    """Scrape every `interval_s` until `stop` is set; failed scrapes are skipped (an engine that
    died mid-run must not take the poller down). Pass `into` to keep the snapshots if cancelled.

    The pages are parsed when first read, after the run: parsing one costs the event loop tens of
    milliseconds, which would stall the replay's client (its token timestamps) and thin out the
    polls. A page that turns out not to be Prometheus text counts as a failed scrape in `peak`."""
    snapshots = [] if into is None else into
    while not stop.is_set():
        with contextlib.suppress(ScrapeError):
            _, page = await _fetch(http, base_url)
            snapshots.append(Snapshot(time.perf_counter(), page))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return snapshots


def peak(snapshots: list[Snapshot], name: str = KV_CACHE_USAGE) -> float | None:
    """The highest `name` over the snapshots (those whose lines of it do not parse are skipped). Only
    `name`'s sample lines are parsed: a run's pages are all read here, each with hundreds of samples."""
    prefixes = (f"{name}{{", f"{name} ")
    values: list[float] = []
    for snapshot in snapshots:
        lines = "\n".join(line for line in snapshot.page.splitlines() if line.startswith(prefixes))
        with contextlib.suppress(MetricsParseError):
            if (value := parse(lines, snapshot.t).get(name)) is not None:
                values.append(value)
    return max(values) if values else None
