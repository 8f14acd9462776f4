"""Workload: spec → requests → scheduled streaming replay → summary, plus /metrics scraping.

Names load on first use (PEP 562): reading a scenario needs only the spec, and a refused command
should not pay for importing the HTTP stack. The replay function is `workload.replay.replay`: a
package attribute of that name is its submodule once anything has imported it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RequestResult": "client", "StreamingClient": "client", "http_client": "client",
    "Replayer": "replay", "ReplayResult": "replay",
    "RequestSpec": "request_spec", "RequestSet": "requests", "build_requests": "requests",
    "Arrivals": "spec", "LengthDist": "spec", "SyntheticRequests": "spec", "TraceRequests": "spec",
    "WorkloadError": "spec", "WorkloadSpec": "spec", "summarize": "summary", "TraceError": "trace",
}  # fmt: skip

__all__ = [
    "Arrivals", "LengthDist", "ReplayResult", "Replayer", "RequestResult", "RequestSet", "RequestSpec",
    "StreamingClient", "SyntheticRequests", "TraceError", "TraceRequests", "WorkloadError", "WorkloadSpec",
    "build_requests", "http_client", "summarize",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
