"""User-facing configuration errors: one line per mistake, never echoing a secret,
exit status 2 (``USER_ERROR_EXIT``, which ``primus.runtime.rundir.ExitCode`` lists with the others),
never a traceback.

Every check that finds a user mistake raises ``ConfigError``; one that can find several at once
(a schema, a section of engine keys) raises ``ConfigError.of_all`` so the user sees every mistake
of the file in one go (at most ``MAX_REPORTED``), as ``tune validate`` does.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

from primus.config.synonyms import synonym_in


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


USER_ERROR_EXIT = 2
MAX_REPORTED = 20


class ConfigError(Exception):
    """A mistake in the user's input (file, key, value, path): printed one line per mistake."""

    exit_code = USER_ERROR_EXIT

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(mask_secrets(" ".join(str(message).split())))
        self.key = key  # the dotted key at fault, when there is one
        self.errors: list[ConfigError] = [self]

    @classmethod
    def at(cls, where: str | None, key: str, message: str, hint: str = "") -> "ConfigError":
        """``where: key: message hint`` — ``where`` is a file:line or command-line token."""
        prefix = f"{where}: " if where and where != key else ""
        return cls(f"{prefix}{key}: {message}{hint}", key=key)

    @classmethod
    def of_all(cls, errors: Iterable["ConfigError"]) -> "ConfigError":
        """One error carrying several mistakes (the first ``MAX_REPORTED``); a single one as itself."""
        errors = [e for error in errors for e in error.errors]
        if len(errors) == 1:
            return errors[0]
        combined = cls(errors[0].args[0], key=errors[0].key)
        combined.errors = errors[:MAX_REPORTED]
        combined.omitted = max(0, len(errors) - MAX_REPORTED)
        return combined

    def lines(self) -> list[str]:
        lines = [str(error) for error in self.errors]
        if getattr(self, "omitted", 0):
            lines.append(f"... and {self.omitted} more")
        return lines


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for another engine's name of the same setting, else the closest
    candidate, or an empty string.

    Whole underscore-separated words count first (``expert_model_parallel_sise`` is closest to
    ``expert_model_parallel_size``, not ``pipeline_model_parallel_size``), then characters."""
    candidates = [str(c) for c in candidates]
    word = str(word)
    synonym = synonym_in(word, candidates)
    if synonym is not None:
        return f" (did you mean '{synonym}'?)"
    matches = difflib.get_close_matches(word, candidates, n=5, cutoff=0.6)
    if not matches:
        return ""
    words = set(word.lower().split("_"))
    best = max(matches, key=lambda c: (len(words & set(c.lower().split("_"))),
                                       difflib.SequenceMatcher(None, word, c).ratio()))
    return f" (did you mean '{best}'?)"
