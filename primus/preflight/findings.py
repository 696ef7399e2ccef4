"""A finding is one observation of a check: a level, a one-line message and its details.

Levels order as ``info < warn < fail``. Only ``fail`` changes the exit status (see
``primus.preflight``); ``warn`` is for what works but is likely slow or fragile.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

LEVELS = ("info", "warn", "fail")


@dataclass
class Finding:
    check: str  # environment, host, accelerators, network, connectivity, experiment, performance
    level: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)  # the ranks it is about; empty = the job

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"finding level must be one of {LEVELS}, got {self.level!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return cls(**data)


def info(check: str, message: str, ranks: list[int] | None = None, **details: Any) -> Finding:
    return Finding(check, "info", message, details, list(ranks or []))


def warn(check: str, message: str, ranks: list[int] | None = None, **details: Any) -> Finding:
    return Finding(check, "warn", message, details, list(ranks or []))


def fail(check: str, message: str, ranks: list[int] | None = None, **details: Any) -> Finding:
    return Finding(check, "fail", message, details, list(ranks or []))


def worst(findings: list[Finding]) -> str:
    """The highest level present, ``info`` for none."""
    return max((f.level for f in findings), key=LEVELS.index, default="info")


def describe_ranks(ranks: list[int], hosts: dict[int, str]) -> str:
    """``rank 3 (node-b), rank 7 (node-c)``: how a report names ranks, always with their host."""
    return ", ".join(f"rank {r} ({hosts.get(r, 'host unknown')})" for r in sorted(ranks))
