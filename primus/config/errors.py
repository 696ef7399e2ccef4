"""User-facing configuration errors: one line, never a traceback; the CLI exits with
``ExitCode.BAD_INPUT`` (``primus.runtime.rundir``, where every exit status is defined)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


_SECRET_VALUES: set[str] = set()  # values of secret keys met so far (primus.config.secrets.remember_secrets)
_MASK = "<redacted>"


def remember_secret(value: str) -> None:
    if len(value) >= 4:  # shorter ones would mask ordinary text
        _SECRET_VALUES.add(value)


def mask_secrets(text: str) -> str:
    """``text`` with every secret value seen in this process masked."""
    for value in sorted(_SECRET_VALUES, key=len, reverse=True):
        text = text.replace(value, _MASK)
    return text


class ConfigError(Exception):
    """A mistake in the user's input (file, key, value, path). Printed as one line, never echoing
    a secret value."""

    def __init__(self, message: str):
        super().__init__(mask_secrets(" ".join(str(message).split())))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""
