"""Workload: spec → requests → scheduled streaming replay → summary, plus /metrics scraping."""

from autotuner.workload.client import RequestResult, StreamingClient, http_client
from autotuner.workload.replay import Replayer, ReplayResult, replay
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.requests import RequestSet, build_requests
from autotuner.workload.spec import (
    Arrivals,
    LengthDist,
    SyntheticRequests,
    TraceRequests,
    WorkloadError,
    WorkloadSpec,
)
from autotuner.workload.summary import summarize
from autotuner.workload.trace import TraceError

__all__ = [
    "Arrivals", "LengthDist", "ReplayResult", "Replayer", "RequestResult", "RequestSet", "RequestSpec",
    "StreamingClient", "SyntheticRequests", "TraceError", "TraceRequests", "WorkloadError", "WorkloadSpec",
    "build_requests", "http_client", "replay", "summarize",
]  # fmt: skip
