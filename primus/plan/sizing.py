"""How a plan's network is sized, whatever it is: ``primus plan`` and preflight ask the plan's
``sizing`` and never which kind of network they hold.

Two kinds today: an LLM (``ModelSpec`` on a ``ParallelLayout``: ``estimate.py``) and a Wan video
diffusion transformer (``WanSpec``, the diffusion description, on a ``DiffusionLayout``:
``diffusion.py``). A recipe names its kind when it builds the plan; preflight's workers get the
kind with the shapes (``payload``) and find the same sizing again by it (``SIZINGS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from primus.plan.layout import LayoutIssue

M = TypeVar("M")
L = TypeVar("L")


class Estimate(Protocol):
    """What both estimates answer (``estimate.Plan``, ``diffusion.WanPlan``)."""

    memory: Any
    device_memory: int | None

    @property
    def fits(self) -> bool | None: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Sizing(Generic[M, L]):
    """The planner's functions for one kind of network."""

    kind: str
    check: Any  # (model, layout, world_size) -> list[LayoutIssue]
    make: Any  # (model, layout, device, *, device_memory, usable_fraction) -> Estimate
    format: Any  # (estimate) -> the table ``primus plan`` prints
    summary: Any  # (model, layout, estimate) -> preflight's one-line finding
    hint: str  # what to try when it does not fit
    model_from: Any  # dict -> model
    layout_from: Any  # dict -> layout

    def problems(self, model: M, layout: L, world_size: int | None = None) -> list[LayoutIssue]:
        return self.check(model, layout, world_size)

    def estimate(self, model: M, layout: L, device: str | None = None, *, device_memory: int | None = None,
                 usable_fraction: float = 0.9) -> Estimate:
        return self.make(model, layout, device, device_memory=device_memory, usable_fraction=usable_fraction)

    def payload(self, model: M, layout: L) -> dict[str, Any]:
        """Model and layout as plain data (what the launcher hands preflight's workers)."""
        dump = model.model_dump() if hasattr(model, "model_dump") else model.to_dict()
        return {"kind": self.kind, "model": dump, "layout": layout.to_dict()}


def _llm() -> Sizing:
    from primus.plan.estimate import format_plan, make_plan
    from primus.plan.layout import ParallelLayout, check_layout
    from primus.plan.model import ModelSpec

    def summary(model, layout, plan) -> str:
        return (f"{plan.params.total:,} parameters ({plan.params.per_rank:,} per rank), "
                f"{plan.flops.per_token:.3g} FLOPs/token, {plan.flops.per_step:.3g} FLOPs/step")

    return Sizing("llm", check_layout, make_plan, format_plan, summary, "recompute, more tp/pp, or sharding",
                  lambda data: ModelSpec(**data), ParallelLayout.from_dict)


def _diffusion() -> Sizing:
    from primus.plan.diffusion import DiffusionLayout, WanSpec, check_wan_layout, format_wan_plan, make_wan_plan

    def summary(model, layout, plan) -> str:
        return (f"{model.total_params():,} parameters per expert, {layout.clip.tokens(model):,} tokens/sample, "
                f"{plan.flops_per_sample:.3g} FLOPs/sample, {plan.flops_per_step:.3g} FLOPs/step")

    return Sizing("wan", check_wan_layout, make_wan_plan, format_wan_plan, summary,
                  "activation checkpointing or more ranks", WanSpec.from_dict, DiffusionLayout.from_dict)


LLM = _llm()
DIFFUSION = _diffusion()
SIZINGS = {sizing.kind: sizing for sizing in (LLM, DIFFUSION)}


def from_payload(payload: dict[str, Any]) -> tuple[Sizing, Any, Any]:
    """(sizing, model, layout) back from ``Sizing.payload``."""
    sizing = SIZINGS[payload.get("kind", "llm")]
    return sizing, sizing.model_from(payload["model"]), sizing.layout_from(payload["layout"])
