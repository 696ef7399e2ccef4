"""What one AMD Primus key becomes here: a rule per key, and the record of what was done.

Every rule says, in words a user reads, what the key does in Primus. Rules come in a few
kinds, each built by one function below so the per-framework tables read as data:

- ``rename``: the same setting under our name (a value conversion at most);
- ``inert``: accepted, no effect here, whatever the value (AMD-internal plumbing);
- ``kernel``: an AMD kernel switch (Primus-Turbo, AITER, ...); on, the run says once that the
  stock kernel is used (``derived ... (Primus-Turbo not installed)``); same math either way;
- ``unsupported``: a feature this Primus cannot honour; off (its AMD default) it is accepted,
  on it is refused, at resolve time (``when="resolve"``: the model or data would differ) or when
  the run starts (``when="run"``: ``config validate``, ``plan`` and ``train --dry-run`` still
  accept the file, as Megatron-LM's own precision flags are handled);
- ``custom``: a function, for keys whose meaning needs their neighbours.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from primus.config.secrets import shown_value

# The values AMD Primus uses for "feature off".
OFF: tuple[Any, ...] = (False, None, 0, "", [], {})

Action = Literal["rename", "inert", "kernel", "unsupported", "custom"]


# What a translated key becomes, by kind, in the ``translated X → Y (why)`` line.
_OUTCOME = {"inert": "no effect", "kernel": "stock kernel here", "refuse_at_run": "refused when the run starts"}


@dataclass(frozen=True)
class Translation:
    """One AMD key turned into ours (or into nothing), as said in the logs and ``--why``."""

    source: str  # the AMD dotted key, relative to the module params
    value: Any
    target: str | None  # our dotted key (experiment-level ones start with "logging.")
    why: str
    kind: str = "rename"  # rename | inert | kernel | refuse_at_run | stage | differs
    where: str = ""  # file:line of the AMD key
    target_value: Any = None
    feature: str | None = None  # refuse_at_run: the primus.runtime.capabilities row that decides per target

    def __post_init__(self) -> None:
        """A secret's value (``HF_TOKEN: hf_…`` among a module's keys) is never kept: this record
        is printed, logged and saved with the run."""
        object.__setattr__(self, "value", shown_value(self.source, self.value))
        object.__setattr__(self, "target_value", shown_value(self.target or self.source, self.target_value))

    def line(self) -> str:
        if self.kind == "differs":  # a change of meaning is never called a translation
            return (f"differs: {self.source}={_show(self.value, cut=False)} → "
                    f"{self.target}={_show(self.target_value, cut=False)} runs ({self.why})")
        if self.kind in ("rename", "stage"):
            outcome = f"{self.target}={_show(self.target_value)}"
        else:
            outcome = _OUTCOME.get(self.kind, self.kind)
        return f"translated {self.source}={_show(self.value)} → {outcome} ({self.why})"

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.source, "value": self.value, "to": self.target, "to_value": self.target_value,
                "why": self.why, "kind": self.kind, "where": self.where,
                **({"feature": self.feature} if self.feature else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Translation":
        return cls(data["from"], data.get("value"), data.get("to"), data.get("why", ""), data.get("kind", "rename"),
                   data.get("where", ""), data.get("to_value"), data.get("feature"))


def show(value: Any, cut: bool = True) -> str:
    """A value as the lines print it (YAML's true/false/null; long values cut unless ``cut`` is false:
    a ``differs:`` line says in full what runs, e.g. a pipeline layout)."""
    return _show(value, cut)


def _show(value: Any, cut: bool = True) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    text = "null" if value is None else str(value)
    return text if len(text) <= 60 or not cut else text[:57] + "..."


@dataclass(frozen=True)
class Rule:
    key: str  # AMD dotted key relative to the module params; "section.*" covers a whole section
    action: Action
    why: str
    target: str | None = None  # our dotted key for rename
    experiment: bool = False  # the target is an experiment-level key (logging.level), not a module param
    convert: Callable[[Any], Any] | None = None
    off: tuple[Any, ...] = OFF  # values meaning "feature off" (kernel / unsupported)
    when: Literal["resolve", "run"] = "run"
    function: Callable[..., None] | None = None  # custom(value, ctx)

    def is_off(self, value: Any) -> bool:
        return value in self.off  # == comparison: AMD files write false and 0 alike


def switch(value: Any) -> bool:
    """An AMD on/off key's value: YAML's true/false, or the 0/1 its argparse-era files write;
    anything else (``maybe``, a mapping) is a ``ValueError`` the rule turns into one line."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{_show(value)!s} is not true or false")


def negated(value: Any) -> bool:
    """``disable_X: true`` -> ``X: false``, for a valid on/off value only."""
    return not switch(value)


def rename(key: str, target: str, why: str, *, convert: Callable[[Any], Any] | None = None,
           experiment: bool = False) -> Rule:
    return Rule(key, "rename", why, target=target, convert=convert, experiment=experiment)


def inert(key: str, why: str) -> Rule:
    return Rule(key, "inert", why)


def kernel(key: str, why: str, *, off: tuple[Any, ...] = OFF) -> Rule:
    return Rule(key, "kernel", why, off=off)


def unsupported(key: str, why: str, *, off: tuple[Any, ...] = OFF, when: Literal["resolve", "run"] = "run") -> Rule:
    return Rule(key, "unsupported", why, off=off, when=when)


def custom(key: str, why: str, function: Callable[..., None]) -> Rule:
    return Rule(key, "custom", why, function=function)


def table(*rules: Rule) -> dict[str, Rule]:
    """Rules by key; a key given twice is a bug in the table."""
    out: dict[str, Rule] = {}
    for rule in rules:
        if rule.key in out:
            raise ValueError(f"compat table: {rule.key} given twice")
        out[rule.key] = rule
    return out
