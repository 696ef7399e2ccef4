"""One rank of a memory measurement: each case's model built through Primus's own backend code (the
adapter's plan, the Megatron trainer's setup / TorchTitan's trainer build), one training step, the
bytes this rank holds counted from its real tensors (``primus.backends.<engine>.memory``).

    python -m torch.distributed.run --nproc-per-node N memory_worker.py CASES.json OUT_DIR

CASES.json: ``[{"name": ..., "exp": EXPERIMENT.yaml, "overrides": [...]}, ...]``, every case on the N
ranks, each resolved and planned as ``primus train`` does (``plan_module``). Writes ``OUT_DIR/<name>.rank<R>.json``: {weights, grads, optimizer, activations, loss,
coordinates of this rank}.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path


class _Reporter:
    """What RunContext.report_step needs from a metrics reporter: the step's loss back."""

    def report(self, report):
        return report

    def close(self, status=None):
        pass


def _context(rank: int, world: int):
    from primus.runtime.context import RunContext

    return RunContext(run_dir=Path(tempfile.mkdtemp(prefix="primus-memory-")), rank=rank, local_rank=rank,
                      world_size=world, device="cpu", logger=logging.getLogger("memory_worker"),
                      reporter=_Reporter())


def _plan(case: dict, world: int):
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import plan_module, select_module
    from primus.runtime.registry import backend_defaults, backend_derived

    resolved = resolve_experiment(case["exp"], case.get("overrides", []), backend_defaults, backend_derived)
    return plan_module(resolved, select_module(resolved, None), world)


def megatron_case(plan, rank: int, world: int) -> dict:
    from megatron.core import parallel_state as ps

    from primus.backends.megatron.memory import measure_rank
    from primus.backends.megatron.trainer import MegatronTrainer

    trainer = MegatronTrainer(plan.engine_config, _context(rank, world))
    try:
        trainer.setup()
        result = measure_rank(trainer)
        result.update(pp=ps.get_pipeline_model_parallel_rank(), tp=ps.get_tensor_model_parallel_rank(),
                      dp=ps.get_data_parallel_rank(with_context_parallel=True),
                      ep=ps.get_expert_model_parallel_rank(), edp=ps.get_expert_data_parallel_rank())
    finally:
        trainer.close()
    return result


def torchtitan_case(plan, rank: int, world: int) -> dict:
    from primus.backends.torchtitan.memory import measure_rank
    from primus.backends.torchtitan.patches import apply_patches
    from primus.backends.torchtitan.recipes.pretrain import register_local_datasets

    apply_patches()  # what the pretrain recipe's run does first: a pure plan registers and patches nothing
    register_local_datasets()
    return measure_rank(plan, _context(rank, world))


def main() -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    for case in cases:
        adapter, plan = _plan(case, world)
        if rank == 0:  # the tiny tokenizer and corpus, once, as the launcher does before any rank starts
            adapter.prepare(plan, lambda message: None)
        dist.barrier()
        if plan.module.framework == "megatron":
            from primus.backends.megatron.patches import apply_patches

            apply_patches()  # what the recipe's run applies around the trainer
        run = megatron_case if plan.module.framework == "megatron" else torchtitan_case
        result = run(plan, rank, world)
        (out / f"{case['name']}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main())
