"""Writes docs/scenario-reference.md and docs/daemon-config-reference.md from the pydantic models, so the
reference cannot drift from what the loader accepts; tests/suite/test_docs.py fails when a page is stale.

    python -m tools.docs_reference          # rewrite both pages
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]


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
    out.append("[← back to the README](../README.md) · [all docs](index.md)")
    return "\n".join(out) + "\n"


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
    }


def main() -> int:
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
