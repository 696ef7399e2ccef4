"""Preflight checks. Each module gathers facts on every rank and judges them on rank 0.

A check module has two functions:

* ``collect(options) -> dict``: this rank's facts, cheap and never raising for a missing
  tool (an absent ``nvidia-smi`` is a fact, not an error). JSON-able.
* ``evaluate(ranks, ctx) -> list[Finding]``: runs on rank 0 over every rank's facts
  (``ranks[r][check_name]``), so consistency across ranks is judged in one place.

``connectivity`` is produced by the worker's rendezvous and barrier, and ``experiment``
from the model and layout, so neither collects anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COLLECTED = ("environment", "host", "accelerators", "network")
ALL_CHECKS = (*COLLECTED, "connectivity", "experiment")


@dataclass
class Context:
    world_size: int
    thresholds: dict[str, Any]
    hosts: dict[int, str]  # rank -> hostname, for the ranks that joined
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def host_names(self) -> list[str]:
        return sorted(set(self.hosts.values()))

    @property
    def multi_node(self) -> bool:
        return len(self.host_names) > 1

    def first_rank_per_host(self) -> dict[str, int]:
        first: dict[str, int] = {}
        for rank in sorted(self.hosts):
            first.setdefault(self.hosts[rank], rank)
        return first


def module(name: str):
    from importlib import import_module

    return import_module(f"primus.preflight.checks.{name}")


def majority_outliers(values: dict[int, Any]) -> tuple[Any, list[int]]:
    """The most common value and the ranks whose value differs from it."""
    counts: dict[str, int] = {}
    for value in values.values():
        counts[repr(value)] = counts.get(repr(value), 0) + 1
    common_repr = max(counts, key=counts.get) if counts else None
    common = next((v for v in values.values() if repr(v) == common_repr), None)
    return common, sorted(r for r, v in values.items() if repr(v) != common_repr)
