"""The fake-world build: each engine's real model for one rank per pipeline stage of a 512-rank world,
on the meta device under torch's fake process group, on this CPU; its bytes equal the plan's, and what the
engine refuses only at that scale is one `fail:` line."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import PRIMUS, ROOT
from tests.helpers import run_cli

pytestmark = pytest.mark.e2e
WORLD_512 = ("--nproc-per-node", "8", "-N", "64")  # TP 8 x PP 8 x DP 8


def _plan(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    return subprocess.run([*PRIMUS, "plan", *map(str, args), "--build"], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tmp_path),
                               "PRIMUS_CPU_BF16": "force"},  # the files' bf16, whether or not this CPU has bf16 units
                          timeout=900)


def _stage_rows(text: str) -> list[list[str]]:
    table = text[text.index("fake-world build:"):].splitlines()[2:]
    return [line.split() for line in table if line.strip() and line.split()[0].isdigit()]


@pytest.mark.parametrize("example, layout", [
    ("megatron/llama3.1_70B-pretrain.yaml", ("pipeline_model_parallel_size=8", "global_batch_size=512",
                                             "num_layers_per_virtual_pipeline_stage=null")),
    ("torchtitan/llama3.1_70B-pretrain.yaml", ("parallelism.pipeline_parallel_degree=8",
                                               "parallelism.data_parallel_shard_degree=8")),
])
def test_70b_on_512_ranks_reports_per_rank_bytes_from_the_real_model(tmp_path, example, layout):
    pytest.importorskip("megatron.core" if example.startswith("megatron") else "torchtitan")
    out = _plan(tmp_path, ROOT / "examples" / example, *WORLD_512, *layout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "model for 512 ranks on the meta device" in out.stdout
    rows = _stage_rows(out.stdout)
    assert [row[:2] for row in rows] == [[str(stage), str(stage * 64)] for stage in range(8)]
    assert "plan differs" not in out.stdout  # the real parameters give the plan's weights, grads, optimizer
    assert all(0.4 < float(row[2]) < 3 for row in rows)  # ~70B / 64 parameters per stage rank, in GiB


def test_a_layout_the_engine_refuses_only_at_scale_is_one_line(tmp_path):
    """2 layers on 8 pipeline stages: the plan's checks pass (the split places every layer); TorchTitan's
    stage split refuses it when it builds the model."""
    pytest.importorskip("torchtitan")
    out = _plan(tmp_path, ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml", "--nproc-per-node", "16",
                "parallelism.pipeline_parallel_degree=8", "training.local_batch_size=8")
    assert out.returncode == 1, out.stdout + out.stderr
    fails = [line for line in out.stdout.splitlines() if line.startswith("fail:")]
    assert fails == ["fail: TorchTitan refuses this layout on 16 ranks (rank 0): Number of stages (8) cannot be "
                     "greater than effective layers (4)"]
    assert "Traceback" not in out.stderr


def test_train_dry_run_builds_the_fake_world_too(tmp_path):
    pytest.importorskip("megatron.core")
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    out = run_cli(["train", ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", "--dry-run", "--build",
                   "--nproc-per-node", "4", "pipeline_model_parallel_size=2"], cwd=ROOT,
                  env={**env, "PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tmp_path)}, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "command:" in out.stdout and len(_stage_rows(out.stdout)) == 2 and "plan differs" not in out.stdout


def test_plan_build_json_carries_the_built_rows(tmp_path):
    pytest.importorskip("megatron.core")
    import json

    out = _plan(tmp_path, ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", "--nproc-per-node", "4",
                "pipeline_model_parallel_size=2", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)["fake_world"]
    assert [(row["pp_rank"], row["rank"]) for row in rows] == [(0, 0), (1, 2)]
    assert all(row["agrees"] and row["built"] == row["planned"] and row["built"]["weights"] > 0 for row in rows)
