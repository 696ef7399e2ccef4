"""Megatron-LM's own FLOPs and parameter formulas, read from a Megatron-LM git mirror at the commit AMD
Primus pins, so tests compare ``primus.plan`` with upstream's code rather than with a transcription.

The functions are taken out of their modules with ``ast`` (megatron.training is not installed, and its
modules import half of Megatron) and run on an ``argparse.Namespace``. Absent mirror: ``None``.
"""
from __future__ import annotations

import ast
import copy
import os
import subprocess
from argparse import Namespace
from functools import lru_cache
from pathlib import Path

MIRROR = Path(os.environ.get("MEGATRON_LM_GIT_DIR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
COMMIT = "d3528a2"


def _source(path: str) -> str | None:
    if not MIRROR.is_dir():
        return None
    result = subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"{COMMIT}:{path}"],
                            capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def _function(source: str, name: str, namespace: dict) -> object:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"megatron-lm:{name}", "exec"), namespace)
    return namespace[name]


@lru_cache(maxsize=1)
def megatron_functions() -> dict | None:
    """``{"flops": num_floating_point_operations, "weights": compute_weight_and_optimizer_memory}``."""
    training = _source("megatron/training/training.py")
    memory = _source("megatron/training/theoretical_memory_usage.py")
    if training is None or memory is None:
        return None
    namespace = {"is_hybrid_model": lambda args: False, "is_linear_attention_variant": lambda variant: False,
                 "print_rank_0": print, "math": __import__("math")}
    return {"flops": _function(training, "num_floating_point_operations", dict(namespace)),
            "weights": _function(memory, "compute_weight_and_optimizer_memory", dict(namespace))}


def megatron_flops_per_token(args: Namespace) -> float:
    """Megatron-LM's training FLOPs of one sequence, per token."""
    return megatron_functions()["flops"](copy.copy(args), 1) / args.seq_length


def megatron_param_count(args: Namespace) -> float:
    """Megatron-LM's parameter count: its weight+optimizer bytes at tp = pp = 1 without the distributed
    optimizer are 18 bytes per parameter of the whole model (the embedding twice when untied)."""
    args = copy.copy(args)
    args.tensor_model_parallel_size = args.pipeline_model_parallel_size = 1
    args.use_distributed_optimizer = False
    return megatron_functions()["weights"](args) / 18


def as_megatron_namespace(resolved) -> Namespace:
    """A ``primus.backends.megatron.plan.resolved_args`` namespace plus the few keys upstream reads
    that planning does not."""
    values = dict(vars(resolved))
    values.setdefault("moe_latent_size", None)
    values.setdefault("attention_output_gate", False)
    values.setdefault("experimental_attention_variant", None)
    values["seq_length"] = values.get("seq_length") or 4096
    return Namespace(**values)


def mirror_available() -> bool:
    return megatron_functions() is not None
