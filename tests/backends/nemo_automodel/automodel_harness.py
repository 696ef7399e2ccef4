"""Drive AutoModelAdapter.run the way the launcher will, until `primus train` exists.

In-process: ``run_adapter(params, stage, run_dir)``. Under torchrun:
``python -m torch.distributed.run --standalone --nproc-per-node 2 automodel_harness.py SPEC.json``
where SPEC.json holds {"params", "stage", "run_dir", "resume"}.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "primus" / "configs"


def deep_merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_example(path: Path, **overrides: Any) -> tuple[str, dict]:
    """(stage, params): defaults < module preset < model preset < experiment overrides < ``overrides``."""
    from primus.backends.nemo_automodel.adapter import AutoModelAdapter

    module = yaml.safe_load(Path(path).read_text())["modules"]["pre_trainer"]
    stage = module["stage"]
    params = AutoModelAdapter().defaults(stage)
    for layer in (yaml.safe_load((CONFIGS / "modules" / "nemo_automodel" / module["config"]).read_text()),
                  yaml.safe_load((CONFIGS / "models" / "nemo_automodel" / module["model"]).read_text()),
                  module.get("overrides") or {}, overrides):
        params = deep_merge(params, layer)
    return stage, params


def run_adapter(params: dict, stage: str, run_dir: Path, resume: bool = False) -> list[dict]:
    from primus.backends.nemo_automodel.adapter import AutoModelAdapter
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.context import RunContext
    from primus.runtime.metrics import MetricsReporter

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    reporter = MetricsReporter(run_dir, rank=rank, world_size=world, device="cpu", peak_tflops=None,
                               enable_tensorboard=False)
    ctx = RunContext(run_dir=run_dir, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)), world_size=world,
                     device="cpu", logger=logging.getLogger("primus.test"), reporter=reporter, resume=resume)
    try:
        AutoModelAdapter().run(ModuleConfig(name="pre_trainer", framework="nemo_automodel", stage=stage,
                                            params=params), ctx)
    finally:
        reporter.close()
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(sys.argv[1]).read_text())
    sys.path.insert(0, str(ROOT))
    run_adapter(spec["params"], spec["stage"], Path(spec["run_dir"]), spec.get("resume", False))
    logging.getLogger("primus.test").info("HARNESS DONE rank=%s", os.environ.get("RANK", 0))
