"""Shared fixtures: the learnable tiny corpus as a Megatron indexed dataset, and a torchrun launcher."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("harness.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    from primus.data.tiny_assets import ensure_tiny_assets

    return ensure_tiny_assets(tmp_path_factory.mktemp("tiny_assets"))


@pytest.fixture(scope="session")
def tiny_indexed(tiny_assets, tmp_path_factory):
    pytest.importorskip("megatron.core")
    from primus.data.indexed import build_indexed_dataset

    prefix = tmp_path_factory.mktemp("tiny_indexed") / "tiny_text_document"
    build_indexed_dataset(tiny_assets["corpus_file"], tiny_assets["tokenizer"], prefix)
    return prefix


def run_megatron(run_dir: Path, params: dict, nproc: int = 1, resume: bool = False, timeout: int = 300) -> list[dict]:
    """torchrun the harness; return metrics.jsonl records (asserts a clean exit)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    params_file = run_dir / "params.json"
    params_file.write_text(json.dumps(params))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(HARNESS), str(run_dir), str(params_file)] + (["--resume"] if resume else [])
    result = subprocess.run(["timeout", "-k", "10", str(timeout), *command], capture_output=True, text=True, env=env)
    (run_dir / "output.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
