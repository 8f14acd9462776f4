"""The vLLM and Docker groups run one member at a time under `-n 2 --dist loadgroup`, and the ledger that
proves it fails a run whose grouping is broken. Each case is a small suite of its own, run by pytester in
a subprocess with two xdist workers and this suite's plugin, whose members only sleep."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.groups import overlapping, runs_of

ROOT = Path(__file__).resolve().parents[2]
MEMBER = """
import time

import pytest

pytestmark = pytest.mark.{mark}


@pytest.mark.parametrize("n", range({count}))
def test_member(n):
    time.sleep({sleep})
"""


@pytest.fixture
def inner_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest('pytest_plugins = ["tests.support.plugin"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    vllm: real vLLM\n    docker: Docker\n")
    pytester.makepyfile(test_vllm_a=MEMBER.format(mark="vllm", count=2, sleep=1.5),
                        test_vllm_b=MEMBER.format(mark="vllm", count=1, sleep=1.5),
                        test_docker=MEMBER.format(mark="docker", count=2, sleep=0.5))
    return pytester


def test_loadgroup_runs_each_group_one_member_at_a_time(inner_suite: pytest.Pytester) -> None:
    result = inner_suite.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_a_broken_grouping_fails_the_members_that_overlapped(inner_suite: pytest.Pytester) -> None:
    """`--dist load` ignores the groups: two vLLM members start at once on the two workers."""
    result = inner_suite.runpytest_subprocess("-n", "2", "--dist", "load", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*group 'vllm' ran two members at once*"])


def test_overlap_is_read_from_the_recorded_times(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join([
        '{"group": "vllm", "test": "a", "worker": "gw0", "event": "start", "t": 0}',
        '{"group": "vllm", "test": "a", "worker": "gw0", "event": "end", "t": 10}',
        '{"group": "vllm", "test": "b", "worker": "gw0", "event": "start", "t": 10}',
        '{"group": "vllm", "test": "b", "worker": "gw0", "event": "end", "t": 20}',
        '{"group": "docker", "test": "d", "worker": "gw1", "event": "start", "t": 5}',
        '{"group": "vllm", "test": "c", "worker": "gw1", "event": "start", "t": 15}',
    ]) + "\n")
    runs = runs_of(ledger, "vllm")
    assert overlapping(runs, "a") == []  # back to back is not an overlap; another group is not a clash
    assert overlapping(runs, "b") == ["c"]  # c is still running (no end yet)
