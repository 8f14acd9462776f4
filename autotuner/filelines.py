"""Bad input in a file, said as `file:line: field: what is allowed`: YAML read with each key's line
kept, pydantic's first error turned into that sentence, and the line of a key in a JSON file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autotuner.errors import UserInputError


class _LineLoader(yaml.SafeLoader):
    """Keeps each mapping's node so that errors can name the line of the offending key."""


def read_text(path: Path, error: type[UserInputError], what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def compose_yaml(text: str, path: Path, error: type[UserInputError]) -> tuple[Any, yaml.Node | None]:
    """The data and its node tree (for lines); malformed YAML is `error` with the line."""
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise error(f"{path}: not valid YAML: nested too deeply") from None
    return data, node


def line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The line of the deepest key of `loc` found in the node tree (a missing key: its mapping's)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if str(key.value) == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind == "missing":
        return "is required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def first_error(exc: ValidationError, path: Path, line: Any) -> str:
    """`file:line: field: what is wrong` for pydantic's first error; `line(loc)` finds the line."""
    first = exc.errors()[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith(("function-", "_"))))
    number = line(loc)
    field = ".".join(str(p) for p in loc) or "(top level)"
    where = f"{path}:{number}" if number else str(path)
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    got = first.get("input")
    # The value errors of our validators already say what they got.
    shown = f", got {got!r}" if isinstance(got, str | int | float) and first["type"] != "value_error" else ""
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return f"{where}: {field}: {describe(first)}{shown}{more}"


def json_line(text: str, key: str) -> int | None:
    """The line of the first `"key":` in a JSON text (None when it is not there)."""
    match = re.search(rf'"{re.escape(json.dumps(key)[1:-1])}"\s*:', text)
    return text.count("\n", 0, match.start()) + 1 if match else None
