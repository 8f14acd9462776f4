"""Secrets stay in the environment: the rules for telling them apart, and the masks that keep them out
of everything the tuner writes (database, logs, reports, exports, messages).

The first line of defence is to never hold a value where a name will do: the scenario keeps
`${VAR}` as written and the database stores that text. `redact()` is the safety net behind it: it
replaces every secret value the process knows of (variables whose name says secret, the API key,
storage URL passwords) and the password of any URL in a text.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "***"
# Shorter values are too likely to be ordinary text ("1", "true") to be masked wherever they appear.
MIN_SECRET_LEN = 6
# scheme://user:password@host — the password is whatever sits between the first ':' after the user
# and the last '@' before the host.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*:)(?P<password>[^\s'\"]+)(?P<at>@)")

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
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}{m['at']}", text)


def redact(text: str) -> str:
    """`text` with known secret values and URL passwords replaced by ***."""
    for value in known_values():
        if value in text:
            text = text.replace(value, REDACTED)
    return mask_url_passwords(text)


def display_url(url: str) -> str:
    """A storage URL as it may be shown or stored: SQLAlchemy's rendering with the password hidden."""
    if "://" not in url:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return mask_url_passwords(url)


def remember_url_password(url: str) -> None:
    if "://" not in url:
        return
    try:
        remember(make_url(url).password)  # type: ignore[arg-type]
    except (ArgumentError, ValueError):
        match = _URL_PASSWORD.search(url)
        remember(match["password"] if match else None)
