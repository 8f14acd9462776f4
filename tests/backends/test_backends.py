"""The backend seam: every engine kind answers every kind-dependent question, the simulator's argv is
what launches it, and no module but the registry compares anything to a kind string."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import pytest

import autotuner
from autotuner.backends import BACKENDS, SIM, SIM_VIRTUAL, VLLM, Backend, backend_for
from autotuner.backends.base import Backend as BaseBackend
from autotuner.engine.launch import plan_launch
from autotuner.engine_kinds import ENGINE_KINDS
from autotuner.errors import ScenarioError, UserInputError
from autotuner.scenario import EngineSettings, Scenario
from autotuner.tuner.runners import MeasureRunner, TrialRunner, VirtualRunner, runner_for

KINDS_MODULE = Path(autotuner.__file__).parent / "backends" / "kinds.py"
FLAGS = ("simulated", "runs_process", "uses_box_gpus", "accepts_unknown_flags", "checks_host_ram")


def scenario(kind: str, **sim: object) -> Scenario:
    return Scenario.model_validate({"engine": {"kind": kind, "model": "llama-2-7b", "sim": sim},
                                    "monitor": {"kind": "host" if kind == "vllm" else "auto"}})


def test_the_registry_names_every_kind_the_scenario_takes() -> None:
    assert ENGINE_KINDS == ("vllm", "sim", "sim-virtual") == tuple(BACKENDS)
    assert get_args(EngineSettings.model_fields["kind"].annotation) == ENGINE_KINDS
    assert [BACKENDS[k] for k in ENGINE_KINDS] == [VLLM, SIM, SIM_VIRTUAL]
    for kind in ENGINE_KINDS:
        sc = scenario(kind)
        assert backend_for(kind) is backend_for(sc) is backend_for(sc.engine) is BACKENDS[kind]
        assert backend_for(kind).name == kind


@pytest.mark.parametrize("kind", ["vllm", "sim", "sim-virtual"])
def test_each_backend_answers_every_question(kind: str, tmp_path: Path) -> None:
    backend = backend_for(kind)
    sc = scenario(kind)
    assert isinstance(backend, BaseBackend) and not inspect.isabstract(type(backend))
    for flag in FLAGS:
        assert isinstance(getattr(backend, flag), bool), flag
    host = backend.simulated_host_bytes
    assert (host is None) == (not backend.simulated) and (host is None or host > 0)
    assert backend.checks_host_ram == (not backend.simulated) == backend.accepts_unknown_flags
    assert backend.default_command() == sc.engine.command_prefix() and backend.default_command()
    runner = runner_for(sc, tmp_path)  # the tuner's choice, by the backend's runs_process
    assert isinstance(runner, TrialRunner)
    assert isinstance(runner, VirtualRunner if kind == "sim-virtual" else MeasureRunner)
    assert backend.monitor_kind("auto") in ("auto", "sim") and backend.monitor_kind("host") == "host"
    backend.prepare_gpus(sc)
    gpus = backend.box_gpu_indices(sc)
    assert gpus is None or gpus == list(range(sc.sim_gpu_count()))
    assert all(isinstance(a, str) for a in backend.argv_extras(sc, run=2))
    mml, seqs = backend.default_limits(sc, {})
    assert (mml is None and seqs is None) or (isinstance(mml, int) and isinstance(seqs, int))
    assert backend.engine_version(sc)
    inventory = backend.gpu_inventory(sc)
    assert inventory and all(isinstance(line, str) for line in inventory)
    assert len(backend.model_fingerprint(sc)) >= 8


def test_only_the_virtual_backend_runs_no_process_and_holds_no_gpu() -> None:
    assert [b.name for b in BACKENDS.values() if not b.runs_process] == ["sim-virtual"]
    assert [b.name for b in BACKENDS.values() if not b.uses_box_gpus] == ["sim-virtual"]
    assert [b.name for b in BACKENDS.values() if b.simulated] == ["sim", "sim-virtual"]
    assert SIM_VIRTUAL.box_gpu_indices(scenario("sim-virtual")) is None
    assert SIM.monitor_kind("auto") == "sim" and VLLM.monitor_kind("auto") == "auto"


def test_the_sim_argv_extras_are_what_launches_the_simulator() -> None:
    sc = scenario("sim", gpu="rtx-4090", gpus=2, speedup=5, seed=3, noise=0.01)
    extras = ["--sim-gpu", "rtx-4090", "--sim-speedup", "5.0", "--sim-seed", "3", "--sim-noise", "0.01",
              "--sim-gpus", "2"]
    assert SIM.argv_extras(sc) == extras
    plan = plan_launch(sc, {"max-num-seqs": 8}, port=12345, extras=SIM.argv_extras(sc))
    assert plan.argv[-len(extras):] == extras and plan.argv[-len(extras) - 2:-len(extras)] == ["--max-num-seqs", "8"]
    bare = scenario("sim")  # engine.sim.gpus unset: the simulator takes the TP size
    assert SIM.argv_extras(bare) == ["--sim-gpu", "rtx-3090", "--sim-speedup", "10.0", "--sim-seed", "0",
                                     "--sim-noise", "0.03"]
    real = scenario("vllm")  # a real engine gets none of the simulator's arguments
    assert "--sim-gpu" not in " ".join(plan_launch(real, {}, port=12345, extras=VLLM.argv_extras(real)).argv)
    assert not SIM_VIRTUAL.runs_process  # and the virtual engine launches nothing
    assert VLLM.argv_extras(scenario("vllm")) == []


def test_the_virtual_argv_extras_are_what_the_evaluator_parses() -> None:
    sc = scenario("sim-virtual", gpus=4, seed=7, noise=0.0)
    assert SIM_VIRTUAL.argv_extras(sc, run=5) == ["--sim-gpu", "rtx-3090", "--sim-seed", "7", "--sim-noise", "0.0",
                                                  "--sim-run", "5", "--sim-gpus", "4"]
    runner = VirtualRunner(sc, first_run=5)
    assert runner._argv({})[1:] == SIM_VIRTUAL.argv_extras(sc, run=5)
    from autotuner.sim.args import build_config, parse_args

    config = build_config(parse_args(runner._argv({})))
    assert (config.sim.run, config.sim.num_gpus, config.sim.seed, config.sim.noise) == (5, 4, 7, 0.0)


def test_study_key_versions_name_the_kind() -> None:
    assert SIM.engine_version(scenario("sim")).endswith(" (simulated)")
    assert SIM_VIRTUAL.engine_version(scenario("sim-virtual")).endswith(" (simulated, virtual time)")
    assert SIM.gpu_inventory(scenario("sim", gpus=2)) == SIM_VIRTUAL.gpu_inventory(scenario("sim-virtual", gpus=2))
    assert SIM.model_fingerprint(scenario("sim")) == SIM_VIRTUAL.model_fingerprint(scenario("sim-virtual"))


@pytest.mark.parametrize("kind", ["tgi", "", "SIM", "vllm "])
def test_an_unknown_kind_is_bad_input_naming_the_kinds(kind: str) -> None:
    with pytest.raises(UserInputError) as err:
        backend_for(kind)
    assert isinstance(err.value, ScenarioError)
    assert str(err.value) == f"engine.kind: must be one of 'vllm', 'sim' or 'sim-virtual', got {kind!r}"


# --- the rule stays true -------------------------------------------------------------------------------

def _kind_operand(node: ast.expr) -> bool:
    """A kind string, or a collection of nothing but kind strings (`in ("sim", "sim-virtual")`)."""
    if isinstance(node, ast.Constant):
        return node.value in ENGINE_KINDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts:
        return all(isinstance(e, ast.Constant) and e.value in ENGINE_KINDS for e in node.elts)
    return False


def kind_comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(map(_kind_operand, [node.left, *node.comparators])):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and _kind_operand(node.value):
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    return found


def test_the_rule_catches_every_spelling() -> None:
    code = ('a = engine.kind == "sim"\nb = kind in ("sim", "sim-virtual")\nc = "vllm" != x.kind\n'
            'd = k not in ["sim-virtual"]\nmatch kind:\n    case "vllm":\n        pass\n'
            'ok = cmd == ["vllm", "serve"]\nfine = kind == "auto"\n')
    assert [line for line, _ in kind_comparisons(ast.parse(code))] == [1, 2, 3, 4, 6]


def test_only_the_registry_compares_to_a_kind_string() -> None:
    root = Path(autotuner.__file__).parent
    offenders = [f"{path.relative_to(root.parent)}:{line}: {text}"
                 for path in sorted(root.rglob("*.py")) if path != KINDS_MODULE
                 for line, text in kind_comparisons(ast.parse(path.read_text(encoding="utf-8")))]
    assert offenders == [], "ask backend_for(...) instead of comparing engine.kind:\n" + "\n".join(offenders)


def test_backends_stay_small_and_documented() -> None:
    for path in sorted((Path(autotuner.__file__).parent / "backends").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) < 400, path
        assert ast.get_docstring(ast.parse(text)), path
    assert issubclass(type(VLLM), Backend)
