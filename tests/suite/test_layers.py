"""The package layers of autotuner/ (docs/development.md, "Layout"): every import, at module level or inside a function,
points to the same room or down, and the rooms' import graph has no cycle.

A room is a top-level package or module of autotuner/. Run just this check with
`python -m pytest tests/suite/test_layers.py`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "autotuner"

# Low to high. A room may import rooms of its own layer or of a lower one; never a higher one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("errors", "secrets", "filelines", "filelocks", "durations", "stats", "units", "proc_identity",
              "env_references", "logs", "private_files")),
    ("vLLM facts", ("vllm",)),
    ("presets and workloads", ("catalog", "workload")),
    ("schema", ("engine_kinds", "scenario")),
    ("parts", ("trials", "store", "monitor", "sim", "engine")),
    ("engine kinds", ("backends",)),
    ("analysis", ("analysis",)),
    ("twin", ("twin",)),
    ("search", ("tuner",)),
    ("trust", ("trust",)),
    ("rollout", ("export", "deploy", "preflight", "verify", "watch", "init")),
    ("fleet", ("fleet",)),
    ("daemon", ("daemon",)),
    ("front", ("view", "cli", "__main__")),
)
LAYER_OF = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}


def room_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def imported_rooms(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "autotuner" else [f"autotuner.{a.name}" for a in node.names]
        found += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("autotuner.")]
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """room -> imported room -> the `file:line`s that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        room = room_of(path)
        for line, target in imported_rooms(ast.parse(path.read_text(), str(path))):
            if target != room:
                graph[room][target].append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return graph


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert sorted(rooms - set(LAYER_OF)) == [], "add the new room to LAYERS (and the Layout in docs/development.md)"
    assert sorted(set(LAYER_OF) - rooms) == [], "a room in LAYERS no longer exists"


def test_no_import_points_up() -> None:
    up = [f"{where}: {room} ({LAYERS[LAYER_OF[room]][0]}) imports {target} ({LAYERS[LAYER_OF[target]][0]})"
          for room, targets in import_graph().items() if room in LAYER_OF
          for target, wheres in targets.items() if target in LAYER_OF and LAYER_OF[target] > LAYER_OF[room]
          for where in wheres]
    assert up == []


def test_the_rooms_import_graph_has_no_cycle() -> None:
    graph = {room: set(targets) for room, targets in import_graph().items()}
    cycles = []
    for start in graph:
        stack = [(start, [start])]
        while stack:
            room, path = stack.pop()
            for nxt in graph.get(room, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in path and nxt > start:  # each cycle once, from its smallest room
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import autotuner.tuner.study\nfrom autotuner.trials import outcomes", ["tuner", "trials"]),
    ("def f():\n    from autotuner import errors, stats\n", ["errors", "stats"]),
    ("from . import x\nimport os\n", []),
])
def test_the_walk_sees_every_form_of_import(source: str, expected: list[str]) -> None:
    assert [room for _, room in imported_rooms(ast.parse(source))] == expected
