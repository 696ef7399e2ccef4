"""The fake-world check: each pipeline stage's real model, built by the engine for one of its ranks in a
world of any size (a fake process group, the meta device: no memory, no GPU), its bytes beside the plan's.

An engine's builder (``primus.backends.<engine>.fakeworld.rank_state``) builds one rank and returns its
weights, gradients and optimizer state from the real parameters; what it refuses (a layout the engine
rejects at that world size) is a ``ConfigError``. Ranks of one pipeline stage hold the same model; the
first rank of each stage is built. Activations are the plan's: a meta model runs nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from primus.plan.estimate import GIB, rank_memory
from primus.plan.layout import ParallelLayout
from primus.plan.memory import RankState
from primus.plan.model import ModelSpec

Builder = Callable[[Any, ParallelLayout, int, int], RankState]  # (engine config, layout, rank, world)


@dataclass(frozen=True)
class StageCheck:
    pp_rank: int
    rank: int
    built: RankState  # from the engine's own model
    planned: RankState  # primus.plan.memory's arithmetic
    activations: int  # planned: activations and the loss's

    @property
    def total(self) -> int:
        return self.built.weights + self.built.grads + self.built.optimizer + self.activations

    @property
    def agrees(self) -> bool:
        return self.built == self.planned


def check_world(build: Builder, engine_config: Any, model: ModelSpec, layout: ParallelLayout,
                world: int) -> list[StageCheck]:
    """Build the first rank of every pipeline stage of ``world`` ranks."""
    per_stage = world // layout.pp
    checks = []
    for pp_rank in range(layout.pp):
        built = build(engine_config, layout, pp_rank * per_stage, world)
        planned = rank_memory(model, layout, pp_rank, None, None)
        checks.append(StageCheck(pp_rank, pp_rank * per_stage, built,
                                 RankState(planned.weights, planned.grads, planned.optimizer),
                                 planned.activations + planned.logits))
    return checks


def format_checks(checks: list[StageCheck], engine: str, world: int, seconds: float) -> str:
    lines = [f"fake-world build: {engine}'s model for {world} ranks on the meta device, one rank per pipeline "
             f"stage ({seconds:.1f} s)",
             f"  {'stage':>5} {'rank':>6} {'weights':>9} {'grads':>9} {'optimizer':>9} {'activ.*':>9} {'total':>9}  "
             "(GiB; * planned)"]
    for c in checks:
        b = c.built
        note = "" if c.agrees else (f"  plan differs: {c.planned.weights / GIB:.2f} / {c.planned.grads / GIB:.2f} / "
                                    f"{c.planned.optimizer / GIB:.2f}")
        lines.append(f"  {c.pp_rank:>5} {c.rank:>6} {b.weights / GIB:9.2f} {b.grads / GIB:9.2f} "
                     f"{b.optimizer / GIB:9.2f} {c.activations / GIB:9.2f} {c.total / GIB:9.2f}{note}")
    return "\n".join(lines)
