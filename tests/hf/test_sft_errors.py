"""Bad post-training input is one line and exit 2 before any rank starts: nothing trains, nothing is written.

``primus train`` runs in this process (``cli_in_process``): each refusal comes before any rank would start,
so no test here is about a process boundary.
"""
from __future__ import annotations

import functools

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_workspace

pytestmark = pytest.mark.e2e  # the engines' checkpoint importers and configs run for real

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-sft.yaml"
TORCHTITAN = ROOT / "examples" / "torchtitan" / "llama3_tiny-sft.yaml"


@pytest.fixture
def primus_here(workspace, tiny_cache):
    """``primus ARGS`` in this process, with PRIMUS_WORKSPACE/PRIMUS_CACHE pointing at temp dirs."""
    return functools.partial(cli_in_workspace, workspace, tiny_cache)


@pytest.fixture(scope="module")
def narrow_model(tmp_path_factory):
    """A tiny Llama whose MLP is narrower (256) than the llama3_tiny preset's (352)."""
    pytest.importorskip("transformers")
    from primus.hf.tiny import build_tiny_hf_model

    return build_tiny_hf_model(tmp_path_factory.mktemp("narrow") / "llama", "llama", intermediate_size=256)


@pytest.mark.parametrize("example, key", [(MEGATRON, "hf_path"), (TORCHTITAN, "hf_assets_path")])
def test_a_checkpoint_that_does_not_fit_the_model_is_one_line_naming_tensor_and_shapes(
        example, key, narrow_model, primus_here, workspace):
    result = primus_here("train", example, "modules.pre_trainer.model=llama3_tiny.yaml", f"{key}={narrow_model}")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("primus: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr  # (engines' import warnings aside)
    assert "tensor model.layers.0.mlp.gate_proj.weight has shape (256, 128)" in lines[0]
    assert "the model expects (352, 128)" in lines[0] and str(narrow_model) in lines[0]
    assert not (workspace / "amd").exists()  # refused before the run directory was made


def test_sft_without_instruction_data_is_refused(primus_here, workspace):
    result = primus_here("train", MEGATRON, "sft_dataset_name=null")
    assert result.returncode == 2 and "modules.pre_trainer.sft_dataset_name: stage sft needs instruction data" \
        in result.stderr
    missing = primus_here("train", TORCHTITAN, "dataloader.dataset_path=/nonexistent/data.jsonl")
    assert missing.returncode == 2
    assert "modules.pre_trainer.dataloader.dataset_path: /nonexistent/data.jsonl does not exist" in missing.stderr


def test_packing_on_sdpa_with_context_parallelism_is_refused_on_torchtitan(primus_here, workspace):
    """Per-document SDPA masks whole sequences; context parallelism would split them across ranks."""
    result = primus_here("train", TORCHTITAN, "--nproc-per-node", "2", "dataloader.packing=true",
                        "parallelism.context_parallel_degree=2")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("primus: error:")]
    assert len(lines) == 1 and "modules.pre_trainer.dataloader.packing" in lines[0] and "context parallelism" in lines[0]
    assert not (workspace / "amd").exists()
