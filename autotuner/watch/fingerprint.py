"""Which model a deployment serves, as a short string that changes when the weights change.

A local model directory is hashed over what defines the model without reading gigabytes of weights:
its config.json and weight index files, or, without an index, the weight files' names and sizes.
A hub name (or a directory this host cannot read) falls back to "name@revision".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_fingerprint(root: str | None, served: str | None, revision: str | None = None) -> str | None:
    name = root or served
    if name is None:
        return None
    directory = Path(name).expanduser()
    if directory.is_dir() and (digest := _directory_digest(directory)) is not None:
        return f"sha256:{digest}"
    return f"{name}@{revision}" if revision else name


def _directory_digest(directory: Path) -> str | None:
    h = hashlib.sha256()
    found = False
    try:
        config = directory / "config.json"
        if config.is_file():
            h.update(b"config.json\0" + config.read_bytes())
            found = True
        indexes = sorted(directory.glob("*.index.json"))
        for index in indexes:
            h.update(index.name.encode() + b"\0" + index.read_bytes())
            found = True
        if not indexes:
            for weight in sorted(p for p in directory.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()):
                h.update(f"{weight.name}\0{weight.stat().st_size}\0".encode())
                found = True
    except OSError:
        return None  # unreadable from here: the caller falls back to the name
    return h.hexdigest() if found else None
