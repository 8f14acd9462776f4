"""Secrets stay in the environment: the rules for telling them apart, and the masks that keep them out
of everything the tuner writes (database, logs, reports, exports, messages).

The first line of defence is to never hold a value where a name will do: the scenario keeps
`${VAR}` as written and the database stores that text. Behind it, two masks:

- `redact_value(obj)` walks a value (dicts, lists, strings) and masks every string in it. Writers call it
  BEFORE serialising (json.dumps, YAML): once serialised, a secret holding `"`, `\\` or non-ASCII is
  escaped and no longer matches its raw text.
- `redact(text)` is the safety net under already-rendered text: it replaces every secret value the
  process knows of (variables whose name says secret, the API key, storage and endpoint URL passwords)
  in its raw form and in each encoding a writer applies (JSON, YAML double- and single-quoted, URL
  quoting), the password of any URL, and the value of any secret-named URL query parameter
  (`?password=...`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

import yaml
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "***"
# Shorter values are too likely to be ordinary text ("1", "true") to be masked wherever they appear.
MIN_SECRET_LEN = 6
# scheme://user:password@host — the password is whatever sits between the first ':' after the user
# and the last '@' before the host.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*:)(?P<password>[^\s'\"]+)(?P<at>@)")
# ?password=...&sslpassword=...: libpq and SQLAlchemy take a password as a query parameter too.
_QUERY_SECRET = re.compile(r"(?P<head>[?&][A-Za-z0-9_.-]*(?:password|passwd|secret|token|credential|key)"
                           r"[A-Za-z0-9_.-]*=)(?P<value>[^&#\s'\"]+)", re.IGNORECASE)

_lock = threading.Lock()
_known: set[str] = set()


def is_secret_name(name: str) -> bool:
    """A variable whose name says it holds a secret: its value is never written anywhere."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def remember(value: str | None) -> None:
    """A value to mask wherever it would be written (an API key read from a variable, a password)."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _known.add(value)


def known_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value this process knows, longest first (so a value containing another is masked
    whole)."""
    environ = os.environ if environ is None else environ
    found = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    with _lock:
        found |= _known
    return sorted(found, key=len, reverse=True)


def mask_url_passwords(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}{m['at']}", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['head']}{REDACTED}", text)


@lru_cache(maxsize=4096)
def encodings(value: str) -> tuple[str, ...]:
    """`value` as each writer may have rendered it: raw, inside a JSON string (ASCII-escaped or not),
    inside a YAML double- or single-quoted scalar, URL-quoted. Longest first; the short ones dropped."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             quote(value), quote(value, safe=""), quote_plus(value)}
    for style in ('"', "'"):
        for unicode in (False, True):
            dumped = yaml.safe_dump(value, default_style=style, width=2**31, allow_unicode=unicode)
            dumped = dumped.removesuffix("\n").removesuffix("\n...").strip()
            forms.add(dumped[1:-1] if len(dumped) >= 2 and dumped[0] == dumped[-1] and dumped[0] in "'\"" else dumped)
    return tuple(sorted((f for f in forms if len(f) >= MIN_SECRET_LEN), key=len, reverse=True))


def redact(text: str) -> str:
    """`text` with known secret values (in every encoding of `encodings`) and URL passwords replaced by ***."""
    for value in known_values():
        for form in encodings(value):
            if form in text:
                text = text.replace(form, REDACTED)
    return mask_url_passwords(text)


def redact_value(value: Any) -> Any:
    """`value` with every string in it (dict keys included, however deeply nested) passed through
    `redact`: what a writer calls before json.dumps or YAML. Other values are returned as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


def display_url(url: str) -> str:
    """A storage URL as it may be shown or stored: SQLAlchemy's rendering with the password hidden."""
    if "://" not in url:
        return url
    try:
        return mask_url_passwords(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        return mask_url_passwords(url)


def remember_url_password(url: str) -> None:
    """The password of `url` (user:password@ or a secret-named query parameter such as ?password=)
    masked from here on, wherever it appears."""
    if "://" not in url:
        return
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        match = _URL_PASSWORD.search(url)
        remember(match["password"] if match else None)
    else:
        remember(parsed.password)  # type: ignore[arg-type]
        for name, values in parsed.query.items():
            if is_secret_name(name):
                for value in (values,) if isinstance(values, str) else values:
                    remember(value)
    for match in _QUERY_SECRET.finditer(url):  # http(s) endpoints, and what SQLAlchemy did not parse
        remember(match["value"])


# Names that hold a secret word but no secret: kept in a child's environment.
_NOT_SECRET = ("TOKENIZERS_PARALLELISM",)
# The engine's own credential: vLLM downloads a gated model with the Hugging Face token it finds in its
# environment (the way its docs set it up), so an exported HF_TOKEN reaches the engines as it would reach
# `vllm serve`; the scenario's engine.env still takes precedence. Never written anywhere either way.
_ENGINE_CREDENTIALS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def child_environment(environ: Mapping[str, str], keep: Iterable[str] = (), only_ours: bool = False) -> dict[str, str]:
    """The environment an engine or a deploy command gets: ours, less what only the tuner needs.

    A denylist, not an allowlist: an engine needs much of what is set on its box (PATH, HOME, locale,
    TMPDIR, LD_LIBRARY_PATH, CUDA_*, VLLM_*, HF_* caches, OMP_*, TORCHINDUCTOR_*, a VLLM_PYTHON...), and an
    allowlist would break it in ways that show up only on a GPU. Left out, unless named in `keep` (the
    scenario's engine.env and api_key_env):
    - a variable whose name says secret (`is_secret_name`): AUTOTUNER_DAEMON_TOKEN, PGPASSWORD, an
      another service's API key (the Hugging Face token stays: the engine downloads with it);
    - a variable whose value holds a secret this process knows (a storage or endpoint URL's password
      remembered by `remember_url_password`, the API key) or a URL with a password: the database URL
      the daemon's storage reads through `${VAR}`, whatever that variable is called. Proxy variables
      (HTTPS_PROXY...) keep a proxy's credentials: the engine downloads through it.

    `only_ours` (a deploy command: production's own start, written by a person, may need its HF_TOKEN or a
    registry credential): of the secret-named variables only the tuner's own (AUTOTUNER_*) are left out;
    the value rule applies as above.
    """
    kept = set(keep)
    with _lock:
        ours = [v for v in _known if len(v) >= MIN_SECRET_LEN]
    out: dict[str, str] = {}
    for name, value in environ.items():
        if name not in kept:
            if is_secret_name(name) and name not in _NOT_SECRET + _ENGINE_CREDENTIALS and \
                    (not only_ours or name.startswith("AUTOTUNER_")):
                continue
            if any(secret in value for secret in ours):
                continue
            if not name.upper().endswith("_PROXY") and (_URL_PASSWORD.search(value) or _QUERY_SECRET.search(value)):
                continue
        out[name] = value
    return out
