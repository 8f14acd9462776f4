"""Scenario files: every shipped one loads; a bad one gets one message naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.errors import ScenarioError
from autotuner.scenario import load_scenario

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("name", ["long-prompt", "mixed-chat", "quickstart", "cpu-tiny"])
def test_shipped_scenarios_load(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PYTHON", "/opt/vllm/bin/python")
    monkeypatch.setenv("TINY_MODEL", "/models/tiny")
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    assert sc.engine.model
    assert [o.metric for o in sc.objectives] == ["output_tokens_per_s", "ttft_p95_s"]
    if name == "cpu-tiny":
        assert sc.engine.command_prefix()[0] == "/opt/vllm/bin/python"
        assert sc.engine.model == "/models/tiny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine:\n  model: m\n  kind: tgi\n", ":3: engine.kind: must be one of 'vllm', 'sim' or 'sim-virtual'"),
        ("engine:\n  model: m\n  flags:\n    port: 9000\n", ":3: engine.flags: flag 'port' is set by the tuner"),
        ("engine:\n  model: m\nworkload:\n  requests:\n    prompt_tokens: {kind: uniform, low: 9}\n",
         ":5: workload.requests.prompt_tokens: kind uniform needs low, high (missing high)"),
        ("engine:\n  model: m\nmonitor:\n  hz: 0\n", ":4: monitor.hz: Input should be greater than 0, got 0"),
        ("engine:\n  model: m\noom_threshold: {fraction: 0.9, min_free_mib: 512}\n",
         ":3: oom_threshold: give either fraction"),
        ("engine:\n  model: m\nbogus: 1\n", ":3: bogus: unknown field"),
        ("engine:\n  model: m\nslos:\n  ttft_p95_s: 0\n", ":4: slos.ttft_p95_s: Input should be greater than 0"),
        ("engine:\n  model: m\nslos:\n  itl_p99_s: 0.1\n  e2e_p95_s: -3\n",
         ":5: slos.e2e_p95_s: Input should be greater than 0"),
        ("engine:\n  model: m\nslos: {ttft_p95_s: .nan}\n", ":3: slos.ttft_p95_s: Input should be a finite number"),
        ("engine:\n  model: ${NOT_SET_ANYWHERE}\n", ":2: engine.model: '${NOT_SET_ANYWHERE}' uses ${NOT_SET_ANYWHERE}"),
        ("engine: [1, 2\n", "not valid YAML"),
        ("- just\n- a list\n", "a scenario is a mapping"),
        ("engine:\n  model: m\nworkload:\n  requests: {kind: trace, path: missing.jsonl}\n", "no such trace file"),
    ],
)
def test_bad_scenarios_name_the_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


def test_a_relative_model_directory_resolves_from_the_scenario_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "project"
    (folder / "models" / "tiny").mkdir(parents=True)
    (folder / "s.yaml").write_text("engine: {kind: vllm, model: models/tiny}\n")
    (folder / "hub.yaml").write_text("engine: {kind: vllm, model: Qwen/Qwen2.5-0.5B-Instruct}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_scenario(Path("../project/s.yaml")).engine.model == str(folder.resolve() / "models" / "tiny")
    # a hub name stays a hub name
    assert load_scenario(folder / "hub.yaml").engine.model == "Qwen/Qwen2.5-0.5B-Instruct"
