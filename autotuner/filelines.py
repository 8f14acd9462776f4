"""Bad input in a file, said as `file:line: field: what is allowed`: YAML read with each key's line
kept, pydantic's first error turned into that sentence, and the line of a key in a JSON file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autotuner.errors import UserInputError, quoted, shortened

# A config file is a page of YAML: 1 MiB is far beyond any real one, and reading a 50 MB file (or worse,
# /dev/zero) into memory to refuse it later is how a typo becomes a MemoryError.
MAX_CONFIG_BYTES = 1 << 20
# Nodes of the document with every alias expanded: an alias bomb of 543 bytes is 10^8 nodes (and a 312 MB
# error message quoting it). A real scenario has a few hundred.
MAX_NODES = 100_000


class _LineLoader(yaml.SafeLoader):
    """Keeps each mapping's node so that errors can name the line of the offending key; refuses a key given
    twice (YAML's own rule, which PyYAML does not enforce: the later one silently won)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen and isinstance(key, str | int | float | bool):
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {quoted(key)} (lines {seen[key]} and {line}): keep one",
                        key_node.start_mark)
                seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 reads `1e3` and `1e-3` as numbers; PyYAML (YAML 1.1) reads them as text, which the strict models
# would then refuse as "not a number". The numbers a user means are numbers.
_LineLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes the document has once aliases are expanded (an alias is the same node object)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once here; PyYAML's constructor handles it
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(v, memo) for v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


@contextmanager
def reading(path: Path, error: type[UserInputError], what: str) -> Iterator[None]:
    """A file read inside is bad input when it is missing, a folder, not UTF-8 or unreadable: one message
    naming the file and what it should have been."""
    try:
        yield
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_text(path: Path, error: type[UserInputError], what: str, limit: int | None = MAX_CONFIG_BYTES) -> str:
    """The file as UTF-8 text; over `limit` bytes (None: no limit) it is bad input, refused unread."""
    with reading(path, error, what):
        if limit is not None:
            with path.open("rb") as f:
                data = f.read(limit + 1)
            if len(data) > limit:
                raise error(f"{path}: larger than {limit // 1024} KiB: not a {what} (check the path)")
            return data.decode("utf-8")
        return path.read_text(encoding="utf-8")


def load_mapping(path: Path, error: type[UserInputError], what: str,
                 shape: str) -> tuple[dict[str, Any], yaml.Node | None]:
    """A config file's top-level mapping and its node tree (for lines); `shape` says what the mapping holds
    when the file is something else (a list, a bare value)."""
    data, node = compose_yaml(read_text(path, error, what), path, error)
    if not isinstance(data, dict):
        raise error(f"{path}:1: (top level): {shape}")
    return data, node


def compose_yaml(text: str, path: Path, error: type[UserInputError]) -> tuple[Any, yaml.Node | None]:
    """The data and its node tree (for lines); malformed YAML is `error` with the line."""
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        if node is not None and _expanded_size(node, {}) > MAX_NODES:
            raise error(f"{path}: more than {MAX_NODES} values once its aliases (*name) are expanded: "
                        "not a config file (an alias bomb?)")
        data = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{where}: not valid YAML: {shortened(str(problem), 300)}") from None
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
    return shortened(message.removeprefix("Value error, "), 500)


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
    shown = f", got {quoted(got, 120)}" if isinstance(got, str | int | float) and first["type"] != "value_error" \
        else ""
    return f"{where}: {field}: {describe(first)}{shown}{more}"


def json_line(text: str, key: str) -> int | None:
    """The line of the first `"key":` in a JSON text (None when it is not there)."""
    match = re.search(rf'"{re.escape(json.dumps(key)[1:-1])}"\s*:', text)
    return text.count("\n", 0, match.start()) + 1 if match else None
