"""Run-to-run noise of the simulated engine: seeded, off at 0, about the advertised size."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from autotuner.errors import UserInputError
from autotuner.sim.args import build_config, parse_args
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, evaluate
from autotuner.sim.noise import DEFAULT_LEVEL, SLOW_RUN_EVERY, TRANSIENT_JITTER_BYTES, RunNoise, next_run

CASE = ("llama-2-7b", "--sim-gpu", "rtx-4090", "--max-model-len", "4096", "--max-num-batched-tokens", "2048")
SMALL = SyntheticWorkload(prompts=12, prompt_tokens=(1000, 2000), output_tokens=32, concurrency=4)


def run(*argv: str) -> Evaluation:
    config = build_config(parse_args([*CASE, *argv]), {})
    return evaluate(config, SMALL.requests(config.model.vocab_size), SMALL.concurrency)


def test_noise_zero_is_deterministic_whatever_the_run() -> None:
    a, b = run("--sim-noise", "0", "--sim-run", "1"), run("--sim-noise", "0", "--sim-run", "7")
    assert a.metrics == b.metrics
    assert a.memory == b.memory


def test_same_seed_and_run_repeat_exactly_and_other_runs_differ() -> None:
    a, b = run("--sim-run", "3"), run("--sim-run", "3")
    assert a.metrics == b.metrics and a.memory == b.memory
    others = {run("--sim-run", str(r)).metrics["output_tokens_per_s"] for r in range(4, 8)}
    assert len(others) == 4


def test_memory_transient_jitter_is_a_few_hundred_mib_at_most() -> None:
    quiet = max(run("--sim-noise", "0").memory["peak_bytes"])  # type: ignore[arg-type]
    peaks = [max(run("--sim-run", str(r)).memory["peak_bytes"]) for r in range(6)]  # type: ignore[arg-type]
    extra = [p - quiet for p in peaks]
    assert all(0 <= e <= TRANSIENT_JITTER_BYTES + (64 << 20) for e in extra), extra
    assert max(extra) > 32 << 20  # the jitter is there


def test_run_speed_has_the_advertised_spread_and_slow_runs() -> None:
    draws = [RunNoise.draw(DEFAULT_LEVEL, seed=11, run=r) for r in range(2000)]
    fast = [d.speed for d in draws if not d.slow]
    cv = statistics.pstdev(fast) / statistics.fmean(fast)
    assert 0.02 <= cv <= 0.04
    share = sum(d.slow for d in draws) / len(draws)
    assert 0.5 / SLOW_RUN_EVERY <= share <= 1.6 / SLOW_RUN_EVERY
    slow_ratio = statistics.fmean(d.speed for d in draws if d.slow) / statistics.fmean(fast)
    assert 1.10 <= slow_ratio <= 1.20
    assert RunNoise.draw(0.0, 11, 5).step_seconds(0.25) == 0.25


def test_replays_within_a_lifetime_spread_only_when_asked() -> None:
    """Off (the default) a replay is its lifetime's draw exactly; on, each replay of one lifetime has its
    own factor of the asked spread around the lifetime's speed, and the lifetime's memory jitter."""
    base = RunNoise.draw(DEFAULT_LEVEL, seed=3, run=9)
    same = RunNoise.draw(DEFAULT_LEVEL, seed=3, run=9, replay=4)
    assert (same.speed, same.slow, same.transient_bytes) == (base.speed, base.slow, base.transient_bytes)
    assert same.step_seconds(1.0) == base.step_seconds(1.0)
    replays = [RunNoise.draw(0.0, seed=3, run=9, replay=k, within=0.10) for k in range(2000)]
    speeds = [d.speed for d in replays]
    assert 0.08 <= statistics.pstdev(speeds) / statistics.fmean(speeds) <= 0.12
    assert not any(d.slow for d in replays) and {d.transient_bytes for d in replays} == {0}
    both = [RunNoise.draw(DEFAULT_LEVEL, seed=3, run=9, replay=k, within=0.10) for k in range(3)]
    assert {d.transient_bytes for d in both} == {base.transient_bytes}
    assert len({d.speed for d in both}) == 3


def test_server_counts_runs_per_seed(tmp_path: Path) -> None:
    assert [next_run(tmp_path, 4) for _ in range(3)] == [0, 1, 2]
    assert next_run(tmp_path, 5) == 0


@pytest.mark.parametrize("bad", [["--sim-noise", "-0.1"], ["--sim-noise", "0.9"], ["--sim-run", "-1"]])
def test_bad_noise_flags_are_refused(bad: list[str]) -> None:
    with pytest.raises(UserInputError, match="--sim-noise"):
        build_config(parse_args([*CASE, *bad]), {})
