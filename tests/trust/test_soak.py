"""Soak: the worst workload the scenario allows catches what the normal workload does not."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from rich.console import Console

from autotuner.export.exporter import run_export
from autotuner.export.report import run_report
from autotuner.scenario import LengthSettings
from autotuner.trust.soak import longest, soak_scenario
from autotuner.view.study_status import run_status
from tests.support.virtual_studies import scenario, tune

BUDGET = "max-num-batched-tokens"
# Prompts with a long tail (median 900, capped at 4000) two at a time: their steps rarely fill a
# 4096-token budget; the soak sends only 4000-token prompts, so every step is full. A step's unprofiled
# memory grows with its tokens (autotuner/sim/memory.py): 4096 tokens a step at utilization 0.89 passes
# the normal workload (peak ~96 %) with the best throughput and crosses the OOM threshold at the soak;
# 2048 survives both.
LONG_TAIL = {
    "workload.requests.prompt_tokens": {"kind": "lognormal", "median": 900, "sigma": 0.5, "max": 4000},
    "engine.flags": {"max-model-len": 4096, "gpu-memory-utilization": 0.89},
    "workload.arrivals": {"kind": "concurrency", "concurrency": 2},
    "search_space": {BUDGET: {"type": "categorical", "choices": [2048, 4096]}},
}


def test_soak_workload_is_the_longest_prompt_at_peak_concurrency() -> None:
    sc = scenario(**{**LONG_TAIL, "workload.arrivals": {"kind": "concurrency", "concurrency": 8}})
    soaked, text = soak_scenario(sc, {BUDGET: 4096, "max-num-seqs": 6}, 60.0, round_s=5.0)
    r, a = soaked.workload.requests, soaked.workload.arrivals
    assert r.prompt_tokens == LengthSettings(kind="fixed", value=4000)
    assert r.output_tokens == LengthSettings(kind="fixed", value=64)
    assert a.kind == "concurrency" and a.concurrency == 6  # max-num-seqs below the scenario's peak of 8
    assert r.count == 6 * 12 and r.shared_prefix_fraction == 0 and soaked.workload.ignore_eos
    assert "4000 tokens" in text
    # Capped by max-model-len minus the output.
    capped, _ = soak_scenario(scenario(**{**LONG_TAIL, "engine.flags": {"max-model-len": 2048},
                                          "workload.arrivals": {"kind": "concurrency", "concurrency": 8}}), {}, 60.0)
    assert capped.workload.requests.prompt_tokens.value == 2048 - 64
    assert longest(LengthSettings(kind="normal", mean=1000, stddev=100)) == 1300


def test_soak_catches_an_oom_on_long_prompts_and_export_holds_the_survivor(tmp_path: Path) -> None:
    t = tune(tmp_path, scenario(**LONG_TAIL), trials=4)
    rows = t.store.trials(t.study)
    passed_normal = {r.flags[BUDGET] for r in rows if r.outcome == "ok"}
    assert passed_normal == {2048, 4096}, "both configurations pass the normal workload"
    confirmed, soaked = t.trust(top=2, repeats=2, soak_s=60)
    assert confirmed is not None and soaked is not None
    first, second = soaked.verdicts
    by_number = {r.trial_number: r for r in t.store.trials(t.study)}
    assert by_number[first.original].flags[BUDGET] == 4096 and not first.passed
    assert "oom" in (first.reason or "")
    assert by_number[second.original].flags[BUDGET] == 2048 and second.passed
    assert second.ttft_p99_s is not None and second.itl_p99_s is not None and len(second.headroom_gib) == 1
    study = optuna.load_study(study_name=t.study, storage=t.store.optuna_storage())
    assert [tr.user_attrs["soaks"] for tr in study.trials if tr.user_attrs.get("kind") == "soak"] == [
        first.original, second.original]
    out = tmp_path / "w.json"
    assert run_export(t.storage, None, [], "knee", "json", out, force=False) == 0
    doc = json.loads(out.read_text())
    assert doc["certificate"]["trial"] == second.original
    soak = doc["certificate"]["verification"]["soak"]
    assert soak["passed"] and soak["trial"] == second.trial and soak["duration_s"] > 0
    assert run_report(t.storage, None, tmp_path / "report") == 0
    text = (tmp_path / "report" / "report.md").read_text()
    verification = text.split("## Verification", 1)[1].split("\n## ", 1)[0]
    assert f"| {first.trial} | {first.original} | FAILED |" in verification
    assert f"| {second.trial} | {second.original} | passed |" in verification
    # Virtual time records no timeline: a sentence says so instead of a plot of identical bars.
    assert "soak-memory.png" not in verification and "No memory timeline of the soak" in verification
    # `status` lists the soak runs as re-runs of their candidates, not as infeasible candidates.
    console = Console(record=True, width=250)
    assert run_status(t.storage, t.study, console) == 0
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.count("│") > 5}
    for verdict in (first, second):
        assert rows[str(verdict.trial)].split("│")[4].strip() == "re-run", rows[str(verdict.trial)]


def test_the_soak_runs_on_the_confirmed_bests_last_confirmation_engine(tmp_path: Path) -> None:
    """The last round measures the leader last and its engine then serves the soak: when the leader holds,
    the soak costs no engine start of its own, and the certificate says where it ran."""
    t = tune(tmp_path, scenario(), trials=4)
    confirmed, soaked = t.trust(top=2, repeats=2, soak_s=60)
    assert confirmed is not None and soaked is not None and confirmed.soaked
    [verdict] = soaked.verdicts
    assert verdict.passed and verdict.after_confirm and verdict.original == confirmed.confirmed_best
    rows = t.store.trials(t.study)
    last_confirm = max(r.trial_number for r in rows if r.kind == "confirm")
    soak_row = next(r for r in rows if r.kind == "soak")
    assert soak_row.trial_number > last_confirm  # recorded after the confirmation run whose engine it shared
    confirms_of_best = [r for r in rows if r.kind == "confirm" and r.result.get("confirms") == verdict.original]
    assert confirms_of_best[-1].result.get("lifetime") == 2  # the best's last lifetime, its replays before the soak
    # Engine starts of the trust phase: the confirmation's alone.
    out = tmp_path / "w.yaml"
    assert run_export(t.storage, None, [], "knee", "yaml", out, force=False) == 0
    assert "on the engine of its last confirmation run" in out.read_text()
