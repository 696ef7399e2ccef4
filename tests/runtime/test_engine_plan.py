"""One plan per launch: built once per process, read by every command, one FLOPs convention.
(The layers between packages: tests/test_layers.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, read_metrics, run_dir_of

TINY = {"torchtitan": ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml",
        "megatron": ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"}

COUNT_CHECKS = """
import json, sys
import primus.backends.megatron.arguments as arguments
import primus.backends.megatron.admission as admission
import primus.backends.megatron.validate_args as validate_args
import primus.config.schema as schema
from primus.cli.main import main
calls = {"parse_args": 0, "primus_block": 0, "layout_split": 0, "layout_world": 0, "admission": 0}

def counted(module, name, key, when=lambda *a, **k: True):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        calls[key] += bool(when(*args, **kwargs))
        return original(*args, **kwargs)
    setattr(module, name, wrapper)

counted(arguments, "parse_args", "parse_args")
counted(schema, "validate_model", "primus_block", when=lambda model, *a, **k: model is schema.PrimusOptions)
counted(validate_args, "_check_model_split", "layout_split")
counted(validate_args, "_check_world", "layout_world")
counted(admission, "_check_arguments", "admission")
code = main(sys.argv[1:])
print(json.dumps({"code": code, **calls}))
"""


@pytest.mark.e2e
def test_each_check_runs_once_per_process(tmp_path):
    """`config validate`, `train --dry-run` and a one-rank `train` (its worker runs in the launcher's
    process and takes the launcher's plan) parse the Megatron arguments, validate the primus: block,
    check the layout and admit the arguments on this host exactly once each (the trainer's notes come
    from the launcher's admission)."""
    env = {**os.environ, "PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tmp_path / "cache")}
    results = {}
    for name, args in {"validate": ["config", "validate", str(TINY["megatron"])],
                       "dry-run": ["train", str(TINY["megatron"]), "--dry-run"],
                       "train": ["train", str(TINY["megatron"]), "train_iters=3", "exp_name=once"]}.items():
        out = subprocess.run([sys.executable, "-c", COUNT_CHECKS, *args], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    once = {"code": 0, "parse_args": 1, "primus_block": 1, "layout_split": 1, "admission": 1}
    assert results == {"validate": {**once, "layout_world": 0},
                       "dry-run": {**once, "layout_world": 1},
                       "train": {**once, "layout_world": 1}}


@pytest.mark.e2e
def test_one_flops_convention_for_every_llm_backend(run_primus, workspace, tiny_cache):
    """The same network on TorchTitan and Megatron: `primus plan` prints the same FLOPs per token,
    and each run reports exactly that number (so MFU compares across engines)."""
    import os

    from tests.helpers import cli_in_process

    planned = {}
    for backend, example in TINY.items():
        result = cli_in_process("plan", example, "--json", env={**os.environ, "PRIMUS_WORKSPACE": str(workspace),
                                                                "PRIMUS_CACHE": str(tiny_cache)})
        assert result.returncode == 0, result.stderr
        planned[backend] = json.loads(result.stdout)["flops"]["per_token"]
    assert planned["torchtitan"] == planned["megatron"]
    for backend, example in TINY.items():
        steps = ["training.steps=2"] if backend == "torchtitan" else ["train_iters=3"]
        result = run_primus("train", example, f"exp_name=flops-{backend}", *steps)
        assert result.returncode == 0, result.stderr[-2000:]
        for record in read_metrics(run_dir_of(workspace, f"flops-{backend}")):
            reported = record["tflops"] * 1e12 / record["tokens_per_sec"]  # one rank: FLOPs per token
            assert reported == pytest.approx(planned[backend], rel=1e-6)
