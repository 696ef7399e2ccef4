"""Layouts whose memory ``primus plan`` predicts and ``memory_worker.py`` measures, and the comparison.

Shared by the test (tests/plan/test_memory_measured.py: the tolerances) and the benchmark
(benchmarks/plan_memory.py: the residual table in docs/plan.md). Each case is an experiment file and
overrides, resolved and planned as ``primus train`` does, run for one step on 1, 2 or 4 CPU ranks.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("memory_worker.py")
STATIC = ("weights", "grads", "optimizer")
MEGATRON = "examples/megatron/llama3_tiny-pretrain.yaml"
MIXTRAL = "examples/megatron/mixtral_tiny-pretrain.yaml"
TITAN = "examples/torchtitan/llama3_tiny-pretrain.yaml"
DEEPSEEK = "examples/torchtitan/deepseek_v3_tiny-moe-pretrain.yaml"
_MEGATRON_RUN = ["train_iters=1", "seq_length=64", "micro_batch_size=2", "global_batch_size=2", "save_interval=null",
                 "eval_interval=null"]
_TITAN_RUN = ["training.steps=1", "training.seq_len=64", "training.local_batch_size=2", "checkpoint.enable=false",
              "activation_checkpoint.mode=none", "training.mixed_precision_param=float32"]


@dataclass(frozen=True)
class Case:
    name: str
    world: int
    exp: str
    overrides: tuple[str, ...] = ()
    notes: str = ""

    def spec(self, assets: Path) -> dict[str, Any]:
        run = _MEGATRON_RUN if "megatron" in self.exp else _TITAN_RUN
        return {"name": self.name, "exp": str(ROOT / self.exp),
                "overrides": [*run, f"primus.tiny_assets={assets}", *self.overrides]}


def _megatron(name: str, world: int, *overrides: str, exp: str = MEGATRON) -> Case:
    return Case(name, world, exp, overrides)


def _titan(name: str, world: int, *overrides: str, exp: str = TITAN) -> Case:
    return Case(name, world, exp, overrides)


CASES: tuple[Case, ...] = (
    _megatron("megatron-1rank-fp32", 1),
    _megatron("megatron-1rank-bf16-distopt", 1, "bf16=true", "use_distributed_optimizer=true"),
    _megatron("megatron-1rank-full-recompute", 1, "model.n_layers=4", "recompute_granularity=full",
              "recompute_method=uniform", "recompute_num_layers=2"),
    _megatron("megatron-1rank-selective-recompute", 1, "bf16=true", "recompute_granularity=selective"),
    # per-head Q/K norms (32 elements: 64-element alignment padding) and 200k-parameter buckets: the
    # distributed optimizer's uneven shards
    _megatron("megatron-dp2-bf16-distopt-buckets", 2, "bf16=true", "use_distributed_optimizer=true",
              "global_batch_size=4", "model.qk_norm=true", "overlap_grad_reduce=true", "ddp_bucket_size=200000"),
    _megatron("megatron-tp2-sp", 2, "tensor_model_parallel_size=2", "sequence_parallel=true"),
    _megatron("megatron-pp2-4mb", 2, "pipeline_model_parallel_size=2", "global_batch_size=8"),
    _megatron("megatron-ep2-moe-distopt", 2, "use_distributed_optimizer=true", "seq_length=64",
              "micro_batch_size=2", "global_batch_size=4", exp=MIXTRAL),
    _megatron("megatron-pp2-vpp2-dp2-distopt", 4, "model.n_layers=4", "pipeline_model_parallel_size=2",
              "num_layers_per_virtual_pipeline_stage=1", "use_distributed_optimizer=true", "global_batch_size=8"),
    _megatron("megatron-tp2-dp2-bf16-distopt", 4, "tensor_model_parallel_size=2", "sequence_parallel=true",
              "bf16=true", "use_distributed_optimizer=true", "global_batch_size=4"),
    _titan("torchtitan-1rank-fp32", 1),
    _titan("torchtitan-1rank-bf16-full-ac", 1, "training.mixed_precision_param=bfloat16",
           "activation_checkpoint.mode=full"),
    _titan("torchtitan-1rank-selective-ac", 1, "activation_checkpoint.mode=selective"),
    _titan("torchtitan-fsdp2-bf16", 2, "training.mixed_precision_param=bfloat16"),
    _titan("torchtitan-tp2", 2, "parallelism.tensor_parallel_degree=2"),
    _titan("torchtitan-pp2", 2, "model.n_layers=4", "parallelism.pipeline_parallel_degree=2",
           "training.local_batch_size=4"),
    _titan("torchtitan-ep2-moe", 2, "parallelism.expert_parallel_degree=2", exp=DEEPSEEK),
    _titan("torchtitan-hsdp-2x2", 4, "parallelism.data_parallel_replicate_degree=2",
           "parallelism.data_parallel_shard_degree=2"),
    _titan("torchtitan-fsdp2-tp2", 4, "parallelism.tensor_parallel_degree=2"),
)


def measure(cases: list[Case], out: Path, assets: Path, timeout: float = 1800) -> dict[str, list[dict]]:
    """Run ``cases`` (one ``torch.distributed.run`` per world size): {case name: [rank 0's bytes, rank 1's ...]}."""
    results: dict[str, list[dict]] = {}
    for world in sorted({case.world for case in cases}):
        group = [case for case in cases if case.world == world]
        spec = out / f"cases-{world}.json"
        spec.write_text(json.dumps([case.spec(assets) for case in group]))
        env = {**os.environ, "PRIMUS_WORKSPACE": str(out / "workspace"), "PRIMUS_CPU_BF16": "force",
               "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                               "--master-port", str(29700 + world), str(WORKER), str(spec), str(out)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"memory worker on {world} rank(s) failed:\n{proc.stderr[-4000:]}")
        for case in group:
            results[case.name] = [json.loads((out / f"{case.name}.rank{r}.json").read_text()) for r in range(world)]
    return results


def planned(case: Case, assets: Path) -> Any:
    """The plan ``primus plan`` makes for ``case`` (its EnginePlan's model and layout)."""
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import plan_module, select_module
    from primus.runtime.registry import backend_defaults, backend_derived

    spec = case.spec(assets)
    resolved = resolve_experiment(spec["exp"], spec["overrides"], backend_defaults, backend_derived)
    with mock.patch.dict(os.environ, {"PRIMUS_CPU_BF16": "force"}):  # as the measured ranks: whatever this CPU
        _, plan = plan_module(resolved, select_module(resolved, None), case.world, require_engine=False)
    return plan


def default_assets() -> Path:
    return Path(os.environ.get("PRIMUS_CACHE", str(ROOT / ".cache" / "primus"))) / "tiny_llm"


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="primus-plan-memory-"))


@dataclass(frozen=True)
class Residual:
    case: str
    rank: str  # "0", "1", ... or "mean" (MoE activations: the balanced share)
    component: str
    planned: int
    measured: int

    @property
    def relative(self) -> float:
        return (self.planned - self.measured) / self.measured if self.measured else 0.0


def residuals(case: Case, plan: Any, ranks: list[dict]) -> list[Residual]:
    """Plan vs measured, per rank and component. Activations of an MoE model are compared as the mean over
    the ranks: routing at random initialisation sends one rank more tokens than another; the plan
    predicts the balanced share."""
    from primus.plan.estimate import rank_memory

    rows, acts = [], []
    for index, measured in enumerate(ranks):
        shard = measured["dp"] if "dp" in measured else measured.get("dp_shard", 0)
        planned = rank_memory(plan.model, plan.layout, measured.get("pp", 0), shard, measured.get("edp", 0))
        for component in STATIC:
            rows.append(Residual(case.name, str(index), component, getattr(planned, component), measured[component]))
        acts.append(Residual(case.name, str(index), "activations", planned.activations + planned.logits,
                             measured["activations"]))
    if plan.model.is_moe:
        mean = lambda values: round(sum(values) / len(values))  # noqa: E731
        acts = [Residual(case.name, "mean", "activations", mean([r.planned for r in acts]),
                         mean([r.measured for r in acts]))]
    return rows + acts
