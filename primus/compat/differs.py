"""``differs:`` lines: where a file's literal value is not what runs, one line naming the key, the file's
value, what runs and why.

Two sources, one spelling. At resolve time, a compat rule that changes meaning records a
``Translation`` of kind ``differs`` (AMD Primus's ``norm_epsilon``, which AMD Primus itself drops).
At plan time, the engine's own rules: a Megatron argument the experiment set that Megatron-LM's rules
(or Primus's derived pipeline split, MTP placement) changed. ``config validate``, ``plan``,
``train --dry-run`` and each rank's ``info.log`` print the same lines (``lines_for``).
"""
from __future__ import annotations

from typing import Any

from primus.compat.rules import Translation, show


def line(key: str, file_value: Any, runs: str, why: str) -> str:
    return f"differs: {key}={show(file_value, cut=False)} → {runs} runs ({why})"


def notes_without_differences(engine_config: Any) -> list[tuple[str, Any, str, str]]:
    """The engine notes that are not ``differs:`` lines (said as ``derived``)."""
    written = getattr(engine_config, "given_values", {}) or {}
    return [(key, value, reason, level) for key, value, reason, level in getattr(engine_config, "notes", [])
            if not (level == "warning" or (written.get(key) is not None and written.get(key) != value))]


def resolve_lines(module: Any) -> list[str]:
    """The differences decided while the experiment was resolved (compat rules)."""
    return [t.line() for t in getattr(module, "translations", []) if t.kind == "differs"]


def engine_lines(module: Any, engine_config: Any) -> list[str]:
    """What the engine's rules changed among the values the experiment set (Megatron: the argument notes
    of a key the files set to another value, and every warning, e.g. a derived pipeline split)."""
    notes = getattr(engine_config, "notes", None)
    if not isinstance(notes, list):
        return []
    written = getattr(engine_config, "given_values", {}) or {}
    out = []
    for key, value, reason, level in notes:
        given = written.get(key)
        if level == "warning" or (key in written and given is not None and given != value):
            out.append(line(key, given, f"{key}={show(value, cut=False)}", reason))
    return out


def lines_for(module: Any, engine_config: Any = None) -> list[str]:
    """Every ``differs:`` line of one module, resolve-time first; each said once."""
    seen: dict[str, None] = {}
    for text in [*resolve_lines(module), *(engine_lines(module, engine_config) if engine_config is not None else [])]:
        seen.setdefault(text, None)
    return list(seen)


def record(ctx: Any, key: str, value: Any, target: str, runs: Any, why: str, at: str | None = None) -> None:
    """A file's ``key: value`` that does not run: ``target=runs`` does (kind ``differs``). ``at``: the key whose
    file:line the line cites, when ``key`` is a default the file does not write."""
    origin = ctx.last_source(at or key)
    ctx._record(Translation(key, value, target, why, "differs", origin.where if origin else "", runs))
