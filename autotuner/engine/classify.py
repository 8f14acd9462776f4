"""Reading vLLM's log: why an engine failed, and the figures it printed.

Works on real vLLM (GPU and CPU builds, 0.32) and on the simulator, which prints the same lines.
Outcomes follow the engine's own words; the caller adds what only it knows (did we stop it, did it
ever become ready, did the OOM threshold trip).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from autotuner.trials.outcomes import Outcome
from autotuner.vllm.log_patterns import SAMPLER_WARMUP_OOM, TORCH_OOM

# (pattern, outcome before the engine was ready, outcome after), first match wins per line; the most
# specific failure seen in the whole log wins overall (see _RANK).
_RULES: tuple[tuple[re.Pattern[str], Outcome, Outcome], ...] = tuple(
    (re.compile(p), before, after)
    for p, before, after in (
        (r"error: unrecognized arguments: .*", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"error: argument [^:]+: .*", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"Value error, .*", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"validation error for \w+", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"Input should be [^\[]*", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"must be divisible by tensor parallel size.*", Outcome.INVALID_FLAGS, Outcome.INVALID_FLAGS),
        (r"World size \(\d+\) is larger than the number of available GPUs.*", Outcome.INVALID_FLAGS,
         Outcome.INVALID_FLAGS),
        (r"Failed to load model - not enough GPU memory.*", Outcome.STARTUP_FAILED, Outcome.STARTUP_FAILED),
        (r"No available memory for the cache blocks.*", Outcome.STARTUP_FAILED, Outcome.STARTUP_FAILED),
        (r"To serve at least one request with the model's max seq len.*", Outcome.STARTUP_FAILED,
         Outcome.STARTUP_FAILED),
        (r"Free memory on device .* is less than desired GPU memory utilization.*", Outcome.STARTUP_FAILED,
         Outcome.STARTUP_FAILED),
        (r"Available memory on node \d+ .* is less than desired CPU memory utilization.*", Outcome.STARTUP_FAILED,
         Outcome.STARTUP_FAILED),
        (SAMPLER_WARMUP_OOM, Outcome.STARTUP_FAILED, Outcome.STARTUP_FAILED),
        (TORCH_OOM, Outcome.STARTUP_FAILED, Outcome.OOM_CRASH),
        (r"Address already in use.*|could not serve on .*", Outcome.CRASH, Outcome.CRASH),
        (r"Worker proc \S+ died unexpectedly.*", Outcome.CRASH, Outcome.CRASH),
        (r"EngineDeadError: .*", Outcome.CRASH, Outcome.CRASH),
        (r"Engine core initialization failed.*", Outcome.STARTUP_FAILED, Outcome.CRASH),
    )
)
# When several failures show in one log, the root cause is the most specific one.
_RANK = {Outcome.INVALID_FLAGS: 5, Outcome.OOM_CRASH: 4, Outcome.STARTUP_FAILED: 3, Outcome.CRASH: 1}
_GENERIC = ("Engine core initialization failed", "EngineDeadError", "validation error for")

_CLEAN = re.compile(r"^Value error, | \[type=.*$")
_KV_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
_MODEL_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_BUDGET = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)\.|"
                     r"non-default args: .*'max_num_batched_tokens': (\d+)")
_VERSION = re.compile(r"(?:Initializing a V1 LLM engine \(v|vLLM API server version |  version )([\w.+-]+)")
# "(APIServer pid=1234)", "(EngineCore_DP0 pid=1240)", "(VllmWorker TP0 pid=1250)": who wrote the line.
_PROCESS = re.compile(r"^\([\w -]+ pid=(\d+)\)")
_PREFIX = re.compile(r"^\([\w -]+ pid=\d+\) (?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (?:[\d-]+ [\d:]+ \[[^\]]+\] )?")


def clean_reason(line: str) -> str:
    """vLLM's validation message without pydantic's decoration ("Value error, ", " [type=...]")."""
    return _CLEAN.sub("", line.strip()).strip()


@dataclass
class LogFacts:
    """What the log says. Feed lines as they arrive; read at any time."""

    failure: Outcome | None = None
    reason: str | None = None
    failure_after_ready: bool = False
    kv_cache_tokens: int | None = None
    model_load_gib: float | None = None
    model_load_s: float | None = None
    available_kv_gib: float | None = None
    max_num_batched_tokens: int | None = None
    version: str | None = None
    lines: int = 0
    # Every PID the engine named in its log prefixes: its workers, also those that died before we saw them.
    pids: set[int] = field(default_factory=set)
    # Set once we asked the engine to stop: what it logs while shutting down is not a failure.
    stopping: bool = False
    _reason_rank: int = field(default=-1, repr=False)
    _previous: str = field(default="", repr=False)

    @property
    def fatal(self) -> bool:
        """The engine said, after it was ready, that it cannot go on (a runtime CUDA OOM, a dead worker,
        EngineDeadError): it may linger or hang, but it will not serve again."""
        return self.failure is not None and self.failure_after_ready

    def feed(self, line: str, ready: bool = False) -> None:
        self.lines += 1
        if m := _PROCESS.match(line):
            self.pids.add(int(m.group(1)))
        text = _PREFIX.sub("", line.rstrip("\n"))
        if self.kv_cache_tokens is None and (m := _KV_TOKENS.search(text)):
            self.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if m := _MODEL_LOAD.search(text):
            self.model_load_gib, self.model_load_s = float(m.group(1)), float(m.group(2))
        if m := _KV_MEMORY.search(text):
            self.available_kv_gib = float(m.group(1))
        if m := _BUDGET.search(text):
            self.max_num_batched_tokens = int(m.group(1) or m.group(2))
        if self.version is None and (m := _VERSION.search(text)):
            self.version = m.group(1).rstrip(".")
        previous, self._previous = self._previous, text.strip()
        if self.stopping:
            return
        for pattern, before, after in _RULES:
            m = pattern.search(text)
            if m is None:
                continue
            outcome = after if ready else before
            reason = clean_reason(m.group(0))
            if reason.startswith("Input should be"):  # pydantic prints the field on the line before
                reason = f"{previous}: {reason}"
            rank = _RANK[outcome] * 2 + (0 if reason.startswith(_GENERIC) else 1)
            if rank > self._reason_rank:
                self._reason_rank = rank
                self.failure, self.reason = outcome, reason
                self.failure_after_ready = ready
            break


def classify(lines: Iterable[str], ready: bool = False) -> LogFacts:
    facts = LogFacts()
    for line in lines:
        facts.feed(line, ready)
    return facts
