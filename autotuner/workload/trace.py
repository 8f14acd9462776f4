"""JSONL request traces: one JSON object per line, checked line by line so that a bad trace is
reported where it is wrong, not as a failure somewhere in the replay."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotuner.errors import quoted
from autotuner.filelines import reading
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import WorkloadError


class TraceError(WorkloadError):
    """A trace file that cannot be read or has an invalid line; the message names file:line."""


def load_trace(path: Path, require_arrival: bool = False) -> list[RequestSpec]:
    out: list[RequestSpec] = []
    for lineno, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            out.append(_parse_line(line, require_arrival))
        except ValueError as exc:
            raise TraceError(f"{path}:{lineno}: {exc}") from None
    if not out:
        raise TraceError(f"{path}: trace has no requests")
    return out


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, read as a stream (a trace may be large): split on "\n" only, as JSONL is: U+2028,
    U+0085 and the other characters `str.splitlines` also splits on are valid inside a JSON string."""
    with reading(path, TraceError, "trace file"), path.open(encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line.removesuffix("\n").removesuffix("\r")


def _parse_line(line: str, require_arrival: bool) -> RequestSpec:
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__} (one request object per line)")
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError("prompt/messages: give exactly one of `prompt` (a string) or `messages` (a list)")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ValueError(f"prompt: must be a non-empty string, got {_short(prompt)}")
    if messages is not None:
        _check_messages(messages)
    max_tokens = obj.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: must be a positive integer, got {_short(max_tokens)}")
    arrival = obj.get("arrival_s")
    if arrival is None:
        if require_arrival:
            raise ValueError("arrival_s: is required for trace arrivals (seconds from the start)")
    elif isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival) \
            or arrival < 0:
        raise ValueError(f"arrival_s: must be a number ≥ 0, got {_short(arrival)}")
    return RequestSpec(prompt=prompt, messages=messages, max_tokens=max_tokens,
                       arrival_s=None if arrival is None else float(arrival), target_prompt_tokens=None)


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"messages[{i}]: must be an object with `role` (a string) and `content`")
        if not isinstance(m["content"], str | list):
            raise ValueError(f"messages[{i}].content: must be a string or a list of parts")


def _short(value: object) -> str:
    return quoted(value, 60)


def replayed(reqs: list[RequestSpec], replay: int) -> list[RequestSpec]:
    """The trace's k-th replay on one running engine (k > 0): each prompt opens with a marker of the
    replay, so that none finds its first KV block in the prefix cache an earlier replay filled (that one
    would measure a flattered engine), while prompts that share a prefix in the trace still share it
    within the replay. A chat request carries it on its first message. A few tokens more per prompt."""
    if replay <= 0:
        return reqs
    mark = f"[{replay}] "
    out = []
    for r in reqs:
        if r.prompt is not None:
            out.append(replace(r, prompt=mark + r.prompt))
            continue
        messages = [dict(m) for m in r.messages or []]
        content = messages[0]["content"]
        messages[0]["content"] = (mark + content if isinstance(content, str)
                                  else [{"type": "text", "text": mark}, *content])
        out.append(replace(r, messages=messages))
    return out
