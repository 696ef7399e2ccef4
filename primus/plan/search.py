"""Layout search: every legal split of a model over N nodes x G devices, ranked by projected throughput.

Candidates are the products of TP (divisors of the node size), PP (divisors of the layers), virtual
stages, CP, EP/ETP (MoE), micro-batch, recompute and sharding, with DP filling the world; the model's
global batch is kept. A candidate survives when the neutral rules (``primus.plan.layout.check_layout``:
heads, KV groups, widths, layers, batch divisibility, experts) pass, the interleaved schedule has the
micro-batches it needs, and the memory estimate (``primus.plan.estimate``) fits the device. Survivors are
ranked by projected tokens/s/GPU; from the best down, each is then checked by the engine's own rules
(the caller's ``engine_check``, the same planning ``primus config validate`` runs) until ``top`` pass.

Engine-free: the caller passes how a layout is written as that engine's overrides.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from primus.config.errors import ConfigError
from primus.plan.estimate import estimate_memory
from primus.plan.layout import ParallelLayout, check_layout, worst_level
from primus.plan.model import ModelSpec
from primus.plan.profiles import DeviceProfile
from primus.plan.projection import ProjectionOptions, project

MAX_NODES = 100_000  # a cluster larger than any that exists: beyond it the request is a typo
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")
SHARDING = ("none", "optimizer", "fsdp")
ENGINE_CHECKS_PER_ROW = 4  # engine checks allowed per row shown, before the search gives up
TIME_BUDGET_S = 20.0


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass
class Row:
    choice: dict[str, Any]
    step_time: float
    tokens_per_sec_per_gpu: float
    mfu: float
    memory_gb: float
    overrides: list[str] = field(default_factory=list)
    measured_step_time: float | None = None
    measure_error: str | None = None  # why a measured run failed (--measure)


@dataclass
class SearchResult:
    rows: list[Row]
    candidates: int
    fitting: int
    engine_rejected: list[str]
    device: str
    world: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "world_size": self.world, "candidates": self.candidates,
                "fitting": self.fitting, "engine_rejected": self.engine_rejected, "seconds": self.seconds,
                "rows": [asdict(r) for r in self.rows],
                "best_overrides": self.rows[0].overrides if self.rows else []}

    def format(self) -> str:
        head = (f"{'#':>2} {'tp':>3} {'pp':>3} {'vpp':>3} {'cp':>3} {'ep':>3} {'etp':>3} {'dp':>5} {'mbs':>3} "
                f"{'recompute':<9} {'sharding':<9} {'mem GB':>7} {'step s':>8} {'tok/s/GPU':>10} {'MFU':>6}")
        measured = any(r.measured_step_time is not None for r in self.rows)
        if measured:
            head += f" {'measured s':>10}"
        lines = [f"searched {self.candidates} layouts on {self.world} x {self.device}: {self.fitting} fit; "
                 f"top {len(self.rows)} by projected tokens/s/GPU" + (", re-ranked by measurement" if measured else ""),
                 head]
        for i, r in enumerate(self.rows, 1):
            c = r.choice
            line = (f"{i:>2} {c['tp']:>3} {c['pp']:>3} {c['vpp']:>3} {c['cp']:>3} {c['ep']:>3} {c['etp'] or '-':>3} "
                    f"{c['dp']:>5} {c['micro_batch_size']:>3} {c['recompute']:<9} {c['sharding']:<9} "
                    f"{r.memory_gb:>7.1f} {r.step_time:>8.3f} {r.tokens_per_sec_per_gpu:>10.1f} {100 * r.mfu:>5.1f}%")
            if measured:
                line += f" {r.measured_step_time:>10.3f}" if r.measured_step_time is not None else f" {'failed':>10}"
            lines.append(line)
        if self.engine_rejected:
            lines.append(f"{len(self.engine_rejected)} better-ranked layout(s) refused by the engine's rules, e.g.: "
                         f"{self.engine_rejected[0]}")
        if self.rows:
            lines.append("best layout, as overrides:")
            lines.append("  " + " ".join(self.rows[0].overrides))
        return "\n".join(lines)


def check_world(nodes: int, gpus_per_node: int) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"--nodes must be a positive integer, got {nodes!r}")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be a positive integer, got {gpus_per_node!r}")
    if nodes > MAX_NODES:
        raise ConfigError(f"--nodes {nodes}: more than {MAX_NODES:,} nodes is not a cluster to plan for")


def candidates(model: ModelSpec, base: ParallelLayout, *, world: int, gpus_per_node: int,
               shardings=SHARDING, recomputes=RECOMPUTE, context_parallel: bool = True):
    """(layout, vpp) pairs legal by the neutral rules for ``world`` ranks and the base's global batch."""
    gbs = base.effective_global_batch_size
    tps = [t for t in divisors(gpus_per_node) if world % t == 0]
    pps = [p for p in divisors(model.n_layers) if world % p == 0]
    cps = [c for c in (1, 2, 4, 8, 16) if base.seq_len % (2 * c) == 0 or c == 1] if context_parallel else [1]
    eps = [e for e in divisors(model.n_experts) if e <= world] if model.is_moe else [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        if gbs % dp:
            continue
        for ep, mbs in itertools.product(eps, MICRO_BATCHES):
            if (gbs // dp) % mbs:
                continue
            etps = sorted({1, tp}) if model.is_moe else [None]
            for etp, recompute, sharding in itertools.product(etps, recomputes, shardings):
                if sharding != "none" and dp * cp == 1:
                    continue
                layout = replace(base, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                                 global_batch_size=gbs, recompute=recompute == "full", sharding=sharding,
                                 pipeline_layout=None)
                if worst_level(check_layout(model, layout, world)) == "fail":
                    continue
                microbatches = gbs // (dp * mbs)
                for vpp in (1, 2, 4):
                    if vpp > 1 and (pp == 1 or model.n_layers % (pp * vpp) or microbatches % pp):
                        continue
                    yield layout, vpp, recompute


def search(model: ModelSpec, base: ParallelLayout, profile: DeviceProfile, options: ProjectionOptions, *,
           nodes: int, gpus_per_node: int, top: int = 10, usable_fraction: float = 0.9,
           overrides_of: Callable[[dict[str, Any]], list[str]] = lambda c: [],
           engine_check: Callable[[list[str]], str | None] | None = None,
           shardings=SHARDING, recomputes=RECOMPUTE, context_parallel: bool = True) -> SearchResult:
    """Rank the legal, fitting layouts (module docstring). Raises ``ConfigError`` when none is left."""
    check_world(nodes, gpus_per_node)
    started = time.monotonic()
    world = nodes * gpus_per_node
    budget = profile.memory_gib * 1024**3 * usable_fraction
    scored, count, fitting = [], 0, 0
    for layout, vpp, recompute in candidates(model, base, world=world, gpus_per_node=gpus_per_node,
                                             shardings=shardings, recomputes=recomputes,
                                             context_parallel=context_parallel):
        count += 1
        if time.monotonic() - started > TIME_BUDGET_S:
            break
        memory = estimate_memory(model, layout).total
        if memory > budget:
            continue
        fitting += 1
        opts = replace(options, vpp=vpp, recompute=recompute, sequence_parallel=layout.tp > 1,
                       pp_microbatch_size=None)
        result = project(model, layout, profile, opts)
        choice = {"tp": layout.tp, "pp": layout.pp, "vpp": vpp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp,
                  "dp": layout.dp, "micro_batch_size": layout.micro_batch_size, "recompute": recompute,
                  "sharding": layout.sharding, "global_batch_size": layout.effective_global_batch_size,
                  "local_batch_size": layout.effective_global_batch_size // layout.dp if layout.pp > 1
                  else layout.micro_batch_size}
        scored.append(Row(choice, result.step_time, result.tokens_per_sec_per_gpu, result.mfu, memory / 1e9))
    if not count:
        raise ConfigError(f"no legal layout of this model and global batch "
                          f"({base.effective_global_batch_size}) on {nodes} x {gpus_per_node} devices: the search "
                          "space is empty (world too large for the batch, or no TP/PP that divides the model)")
    if not fitting:
        raise ConfigError(f"the model fits nowhere: none of {count} legal layouts on {nodes} x {gpus_per_node} "
                          f"{profile.name} fits {usable_fraction:.0%} of {profile.memory_gib:g} GiB per device")
    # ties (the projection sees no cost in some splits): the simpler layout first, then the smaller footprint
    scored.sort(key=lambda r: (-round(r.tokens_per_sec_per_gpu, 6), r.choice["tp"] * r.choice["pp"] * r.choice["cp"],
                               r.choice["vpp"], r.memory_gb))
    rows, rejected = [], []
    for row in scored:
        if len(rows) >= top or len(rows) + len(rejected) >= top * ENGINE_CHECKS_PER_ROW:
            break
        row.overrides = overrides_of(row.choice)
        problem = engine_check(row.overrides) if engine_check else None
        if problem:
            rejected.append(problem)
            continue
        rows.append(row)
    if not rows:
        raise ConfigError(f"the engine refused every best-ranked layout; first: {rejected[0]}")
    return SearchResult(rows, count, fitting, rejected, profile.name, world, time.monotonic() - started)
