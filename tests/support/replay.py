"""What a replay test feeds the replayer: `reqs` (numbered requests of 4 output tokens, with trace arrival
times when given), `spec` (a small synthetic workload with the given arrivals) and `paced` (a fake server of
tests/support/fake_openai.py that streams each answer at a fixed pace). The workload tests and the view's
request-bar tests replay the same requests, so these live here rather than in tests/workload/test_replay.py."""

from __future__ import annotations

from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec
from tests.support.fake_openai import Recorder, simple_stream, sse_response

SYN = SyntheticRequests(10, LengthDist("fixed", value=10), LengthDist("fixed", value=4))


def reqs(n: int, arrivals: list[float] | None = None) -> list[RequestSpec]:
    return [RequestSpec(prompt=f"p{i}", messages=None, max_tokens=4,
                        arrival_s=None if arrivals is None else arrivals[i]) for i in range(n)]


def spec(arrivals: Arrivals, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(requests=SYN, arrivals=arrivals, **kw)  # type: ignore[arg-type]


def paced(tokens: int = 4, gap_s: float = 0.005, first_s: float = 0.01) -> Recorder:
    return Recorder(lambda _: sse_response(simple_stream(tokens, gap_s=gap_s, first_s=first_s)))
