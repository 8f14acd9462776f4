"""The step that killed a vLLM engine, from the scheduler dump V1 logs before the traceback.

vLLM 0.32's engine core wraps each model execution in `log_error_detail` (vllm/v1/engine/core.py); when it
raises (a CUDA OOM among others) `_dump_engine_exception` (vllm/logging_utils/dump_input.py) logs the
SchedulerOutput of that step: every request it scheduled, new ones with their prompt length, running ones
with the tokens they had computed. Those are the lengths a re-tune must survive. The line shapes live in
`autotuner.vllm.log_patterns`.

Read defensively: a log collector may cut a long record (docker splits at 16 KiB) or put other lines
between its pieces, and the daemon reads a log tail that may begin inside one. What parses is kept; what
was cut is not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotuner.vllm import log_patterns as p


@dataclass(frozen=True)
class CrashStep:
    """One dumped scheduler step."""

    new_prompt_tokens: tuple[int, ...]  # prompt_token_ids_len of each request first scheduled in it
    new_computed_tokens: tuple[int, ...]  # of those, tokens already computed (prefix-cache hits)
    cached_req_ids: tuple[str, ...]  # requests already running (decodes, prefill chunks, resumed)
    cached_computed_tokens: tuple[int, ...]  # their num_computed_tokens, where the dump got that far
    scheduled_tokens: dict[str, int] = field(default_factory=dict)  # req_id → tokens scheduled in the step
    total_scheduled_tokens: int | None = None
    complete: bool = False  # the record was read to its end (total_num_scheduled_tokens seen)

    @property
    def cached_lengths(self) -> tuple[int, ...]:
        """Each running request's context in that step (computed + scheduled): its prompt and output so far,
        the length a prompt replaying it must have to put the same KV and activations on the GPU."""
        return tuple(n + self.scheduled_tokens.get(rid, 0)
                     for rid, n in zip(self.cached_req_ids, self.cached_computed_tokens, strict=False))

    @property
    def prompt_lengths(self) -> tuple[int, ...]:
        """Every request of the step as a prompt length: the new ones, then the running ones."""
        return self.new_prompt_tokens + self.cached_lengths


def crash_steps(log_text: str) -> list[CrashStep]:
    """Every scheduler dump in `log_text`, in log order. A record cut short yields what it holds before the
    cut (`complete=False`); one with no request left readable is dropped."""
    pieces = log_text.split(p.SCHEDULER_DUMP)
    steps = [_step(piece) for piece in pieces[1:]]
    return [s for s in steps if s is not None]


def _step(text: str) -> CrashStep | None:
    # The new requests come first; whatever follows scheduled_cached_reqs= is the rest of the record.
    cached_at = p.DUMP_CACHED.search(text)
    head = text[: cached_at.start()] if cached_at else text
    starts = list(p.DUMP_NEW_REQUEST.finditer(head))
    prompts: list[int] = []
    computed: list[int] = []
    for i, m in enumerate(starts):
        if m.group("prompt") == "None":  # prompt embeddings: no token count to replay
            continue
        end = starts[i + 1].start() if i + 1 < len(starts) else len(head)
        hit = p.DUMP_NEW_COMPUTED.search(head, m.end(), end)
        prompts.append(int(m.group("prompt")))
        computed.append(int(hit.group("n")) if hit else 0)
    ids: tuple[str, ...] = ()
    cached_n: tuple[int, ...] = ()
    scheduled: dict[str, int] = {}
    total: int | None = None
    if cached_at is not None:
        tail = text[cached_at.end():]
        ids = tuple(_unquote(x) for x in cached_at.group("ids").split(",") if x.strip())
        if (n := p.DUMP_CACHED_COMPUTED.search(tail)) is not None:
            cached_n = tuple(int(x) for x in n.group("n").split(",") if x.strip())
        if (m := p.DUMP_NUM_SCHEDULED.search(tail)) is not None:
            for item in m.group("m").split(","):
                key, sep, value = item.rpartition(":")
                if sep and value.strip().isdigit():
                    scheduled[key.strip()] = int(value)
        if (t := p.DUMP_TOTAL_SCHEDULED.search(tail)) is not None:
            total = int(t.group("n"))
    if not prompts and not cached_n:
        return None
    return CrashStep(tuple(prompts), tuple(computed), ids, cached_n, scheduled, total, total is not None)


def _unquote(text: str) -> str:
    return text.strip().strip("'\"")
