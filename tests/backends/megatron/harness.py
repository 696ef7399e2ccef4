"""Run MegatronAdapter on one rank under torchrun, as the Primus worker will (until `primus train`).

    torchrun --standalone --nproc-per-node N harness.py RUN_DIR PARAMS_JSON [--resume]

Losses land in RUN_DIR/metrics.jsonl (rank 0).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path


def main() -> int:
    run_dir, params = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    resume = "--resume" in sys.argv[3:]
    import torch

    torch.set_num_threads(1)
    from primus.backends.megatron.adapter import MegatronAdapter
    from primus.config.errors import ConfigError
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.context import RunContext
    from primus.runtime.metrics import MetricsReporter

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank{rank}] %(name)s: %(message)s")
    reporter = MetricsReporter(run_dir, rank=rank, world_size=world, device="cpu", peak_tflops=None,
                               enable_tensorboard=False)
    ctx = RunContext(run_dir=run_dir, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                     world_size=world, device="cpu", logger=logging.getLogger("primus.megatron"),
                     reporter=reporter, resume=resume)
    module = ModuleConfig(name="pre_trainer", framework="megatron", stage="pretrain", params=params)
    try:
        MegatronAdapter().run(module, ctx)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        reporter.close()
    return 0


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing Manager: needs the guard
    sys.exit(main())
