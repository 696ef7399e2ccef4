"""User-facing configuration errors: one line, never a traceback; the CLI exits with
``ExitCode.BAD_INPUT`` (``primus.runtime.rundir``, where every exit status is defined)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """A mistake in the user's input (file, key, value, path). Printed as one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""
