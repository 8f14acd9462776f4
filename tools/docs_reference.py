"""Writes docs/scenario-reference.md and docs/daemon-config-reference.md from the pydantic models, so the
reference cannot drift from what the loader accepts, and docs/simulator-accuracy.md from the figures
`benchmarks/sim_accuracy.py` measures (autotuner/sim/accuracy_figures.json), so the accuracy a reader sees
is the one measured; tests/suite/test_docs.py fails when a page is stale.

    python -m tools.docs_reference          # rewrite the pages
"""

from __future__ import annotations

import json
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "autotuner" / "sim" / "accuracy_figures.json"
ACCURACY_PAGE = ROOT / "docs" / "simulator-accuracy.md"
# The figures file's keys, named as autotuner/sim/accuracy.py names them to users. Read here from the JSON
# itself, not through that module, so the page needs nothing but the data file; the order is the page's.
METRICS = {"ttft": "TTFT", "tpot": "TPOT", "tput": "throughput"}
CLASSES = {"all": "All published runs", "rtx-3090": "RTX 3090", "rtx-4090": "RTX 4090",
           "datacenter": "Datacenter GPUs"}


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, tuple, set):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {_type_name(args[0])} → {_type_name(args[1])}" if args else "mapping"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    else:
        return "required"
    if isinstance(value, BaseModel):
        return "(see below)"
    text = repr(value.value if hasattr(value, "value") else value)
    return text if len(text) <= 60 else text[:57] + "…"


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def page(title: str, intro: str, root: type[BaseModel], prefix: str = "") -> str:
    out = [f"# {title}", "", intro, "",
           "Generated from the pydantic models by `python -m tools.docs_reference`; do not edit by hand.", ""]
    seen: set[type[BaseModel]] = set()
    queue: list[tuple[str, type[BaseModel]]] = [(prefix, root)]
    while queue:
        path, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out += [f"## `{path or '(top level)'}` — {model.__name__}", ""]
        doc = (model.__doc__ or "").strip().splitlines()
        if doc and not doc[0].startswith(("A base model", "Create a new model")):
            out += [doc[0], ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if field.exclude:
                continue
            key = field.alias or name
            description = " ".join((field.description or "").split()).replace("|", "\\|")
            out.append(f"| `{key}` | {_type_name(field.annotation).replace('|', chr(92) + '|')} | "
                       f"`{_default(field)}` | {description} |".replace("``", "`"))
            for sub in _models(field.annotation):
                queue.append((f"{path}.{key}" if path else key, sub))
        out.append("")
    out.append("[← all docs](index.md)")
    return "\n".join(out) + "\n"


def _ordered(keys: Any, known: dict[str, str]) -> list[str]:
    """The known keys in their order, then any the file adds (a new GPU class shows up, not vanishes)."""
    return [k for k in known if k in keys] + sorted(k for k in keys if k not in known)


def _pct(value: float, signed: bool) -> str:
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def accuracy_page(figures: dict[str, Any]) -> str:
    """docs/simulator-accuracy.md from the contents of accuracy_figures.json."""
    out = ["# Simulator accuracy", "",
           f"How far the simulator is from published vLLM runs: measured on {figures['measured']} against "
           f"{figures['runs']} published runs.", "",
           "Generated from `accuracy_figures.json` (beside `autotuner/sim/accuracy.py`) by "
           "`python -m tools.docs_reference`; do not edit by hand.", "",
           "**How it is measured.** `benchmarks/sim_accuracy.py` replays every row of "
           "`benchmarks/data/published_runs.yaml` (a published vLLM run with its source: GPU, model, flags "
           "and workload) in the simulator's virtual-time evaluator and compares its TTFT, TPOT and throughput "
           "with the reported ones. A row's error is (simulated − reported) / reported. The median is of the "
           "absolute errors; the worst row keeps its sign (+: the simulator's figure is higher than the "
           "published one, which for throughput is optimistic and for TTFT and TPOT pessimistic). A metric "
           "counts only the rows that report it, and not those whose source is marked unreliable, so its "
           "row count can be below the number of runs; a class without rows for a metric shows —.", "",
           "**How it is regenerated.** `python benchmarks/sim_accuracy.py` measures again and rewrites the "
           "figures, which `sim evaluate` and the certificate of a simulated export quote; "
           "`python -m tools.docs_reference` then rewrites this page. The test suite fails while the page "
           "differs from the figures.", ""]
    classes = figures["classes"]
    for name in _ordered(classes, CLASSES):
        out += [f"## {CLASSES.get(name, name)}", "",
                "| metric | rows | median error | worst error | worst row |", "|---|---:|---:|---:|---|"]
        metrics = classes[name]
        for metric in _ordered(metrics, METRICS):
            e = metrics[metric]
            # No rows: the file stores NaN for the errors and "-" for the row.
            if not e["n"] or math.isnan(e["median_pct"]):
                out.append(f"| {METRICS.get(metric, metric)} | 0 | — | — | — |")
                continue
            out.append(f"| {METRICS.get(metric, metric)} | {e['n']} | ±{_pct(e['median_pct'], False)} | "
                       f"{_pct(e['worst_pct'], True)} | `{e['worst_row']}` |")
        out.append("")
    out += ["Where the simulator disagrees with published runs, and why it was not fitted away: "
            "[the simulator](simulator.md).", "", "[← all docs](index.md)"]
    return "\n".join(out) + "\n"


def accuracy_pages(figures: Path = FIGURES) -> dict[Path, str]:
    """The accuracy page, or nothing before benchmarks/sim_accuracy.py has written its figures."""
    if not figures.is_file():
        return {}
    return {ACCURACY_PAGE: accuracy_page(json.loads(figures.read_text()))}


def pages() -> dict[Path, str]:
    from autotuner.daemon.config import DaemonConfig
    from autotuner.scenario import Scenario

    return {
        ROOT / "docs" / "scenario-reference.md": page(
            "Scenario file reference", "Every key of a scenario file (`scenarios/*.yaml`), as the loader checks it. "
            "The story of a scenario is in [tuning on your box](guide.md).", Scenario),
        ROOT / "docs" / "daemon-config-reference.md": page(
            "Daemon config reference", "Every key of the daemon's config file (`autotuner daemon run CONFIG`). "
            "How the daemon uses them is in [the daemon](daemon.md).", DaemonConfig),
        **accuracy_pages(),
    }


def main() -> int:
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    if not FIGURES.is_file():
        print(f"skipped {ACCURACY_PAGE.relative_to(ROOT)}: {FIGURES.relative_to(ROOT)} does not exist yet "
              "(`python benchmarks/sim_accuracy.py` writes it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
