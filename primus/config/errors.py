"""User-facing configuration errors: one line, exit status 2, never a traceback."""
from __future__ import annotations

import difflib
from collections.abc import Iterable

USER_ERROR_EXIT = 2


class ConfigError(Exception):
    """A mistake in the user's input (file, key, value, path). Printed as one line."""

    exit_code = USER_ERROR_EXIT

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for another engine's name of the same setting, else the closest
    spelling, or an empty string."""
    from primus.compat.synonyms import synonym_in  # data only; imported late (compat imports config)

    candidates = [str(c) for c in candidates]
    synonym = synonym_in(str(word), candidates)
    if synonym is not None:
        return f" (did you mean '{synonym}'?)"
    matches = difflib.get_close_matches(str(word), candidates, n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""
