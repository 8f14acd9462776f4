"""One exception tree for the whole tool.

`UserInputError` and its children are bad input: the CLI prints the message and exits 2, having
written nothing. Everything a candidate configuration does wrong is a recorded outcome, never one of
these.
"""

from __future__ import annotations


class AutotunerError(Exception):
    """Base of every error this package raises on purpose."""


class UserInputError(AutotunerError):
    """Bad input from the user (file, flag, path, URL). Exit code 2."""

    exit_code = 2


class ScenarioError(UserInputError):
    """A scenario file that does not validate."""


class ModelSpecError(UserInputError):
    """A model name that is not a preset, or a config.json that cannot describe a model."""


class HardwareSpecError(UserInputError):
    """A GPU name that is not a preset, or a GPU description file that does not validate."""


class InfrastructureError(AutotunerError):
    """Something around the candidate failed (port taken, disk full): retry, do not blame the flags."""


QUOTE_LIMIT = 200


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: a user's value can be megabytes (an
    expanded YAML alias bomb, a 50 MB line), and an error message that size is a denial of service."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def shortened(text: str, limit: int = 1000) -> str:
    """A whole message cut the same way (a validator's message may quote the value itself)."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"
