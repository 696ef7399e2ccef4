"""Packed conversations on TorchTitan's CPU attention: each sees only itself, so packing changes no loss.

The same conversations, through Primus's SFT data layer (``primus.data.sft``), once packed into one
row and once one per padded row, through a tiny TorchTitan Llama (fp32) whose causal SDPA is given
TorchTitan's own document boundaries (``DocumentCausalSDPA``): every response token's loss agrees.
"""
from __future__ import annotations

import pytest

from tests.hf.packing_conversations import CONVERSATIONS

pytest.importorskip("transformers")
pytest.importorskip("torchtitan")


def test_the_document_mask_is_block_diagonal_and_causal():
    import torch

    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()  # before TorchTitan's first import (its device, its triton import)
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    from primus.backends.torchtitan.attention import document_causal_mask

    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]])
    mask = document_causal_mask(create_varlen_metadata_for_document(positions), 2, 5)
    first = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
    second = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    assert mask.shape == (2, 1, 5, 5)
    assert mask[0, 0].equal(first.bool()) and mask[1, 0].equal(second.bool())


@pytest.fixture(scope="module")
def tokenizer(hf_models):
    from primus.data.sft import load_tokenizer

    return load_tokenizer(hf_models("llama"))




def _model(vocab_size: int, document_mask: bool):
    import torch

    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from primus.backends.torchtitan.attention import use_document_sdpa
    from primus.backends.torchtitan.model import build_model_spec
    from primus.plan.model import ModelSpec

    spec = build_model_spec(ModelSpec(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_hidden_size=96,
                                      vocab_size=vocab_size, max_seq_len=256), "sdpa")
    if document_mask:
        assert use_document_sdpa(spec.model) == 2
    torch.manual_seed(0)
    model = spec.model.build()
    model.init_states()
    return model.eval()


def _token_losses(model, rows, document_mask: bool):
    """Per-token cross entropy of each row, with the masks TorchTitan's trainer would build."""
    import torch
    import torch.nn.functional as F

    inputs = torch.tensor([row.inputs for row in rows])
    labels = torch.tensor([row.labels for row in rows])
    positions = torch.tensor([row.positions for row in rows])
    masks = model.get_attention_masks(positions=positions) if document_mask else None
    with torch.no_grad():
        logits = model(inputs, attention_masks=masks, positions=positions)
    losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none", ignore_index=-100)
    return losses.view(labels.shape), labels != -100


def _responses(losses, supervised):
    """The losses of supervised tokens, row by row, in order."""
    return [losses[i][supervised[i]] for i in range(len(losses))]


def test_packed_and_padded_conversations_have_the_same_per_token_losses(tokenizer):
    import torch

    from primus.data.sft import build_sequences, tokenize

    examples = [tokenize(record, tokenizer) for record in CONVERSATIONS]
    lengths = [len(e.tokens) - 1 for e in examples]
    seq_len = sum(lengths) + 5  # one packed row, with a padding document at its end
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    packed, _ = build_sequences(examples, seq_len, pad, packing=True)
    padded, _ = build_sequences(examples, seq_len, pad, packing=False)
    assert len(packed) == 1 and len(padded) == len(CONVERSATIONS)

    model = _model(len(tokenizer), document_mask=True)
    packed_losses = torch.cat(_responses(*_token_losses(model, packed, document_mask=True)))
    padded_losses = torch.cat(_responses(*_token_losses(model, padded, document_mask=True)))
    assert packed_losses.numel() == padded_losses.numel() > 20
    difference = (packed_losses - padded_losses).abs().max().item()
    print(f"packed vs padded: max |loss difference| {difference:.3g} over {packed_losses.numel()} response tokens")
    assert difference <= 1e-5, difference
    assert packed_losses.mean() > 1.0  # a random model: real losses, not a degenerate zero

    # Without the document mask (TorchTitan's causal SDPA) the later conversations see the earlier ones.
    causal = _model(len(tokenizer), document_mask=False)
    causal.load_state_dict(model.state_dict())
    leaked = torch.cat(_responses(*_token_losses(causal, packed, document_mask=False)))
    leak = (leaked - padded_losses).abs().max().item()
    print(f"causal SDPA without the document mask: max |loss difference| {leak:.3g}")
    assert leak > 1e-3


@pytest.mark.e2e
def test_a_packed_torchtitan_sft_run_trains_on_cpu(run_primus, workspace):
    """Packing used to be refused with CPU attention; now the run trains and validates, its log saying how."""
    from tests.conftest import ROOT
    from tests.helpers import read_evals, read_metrics

    example = ROOT / "examples" / "torchtitan" / "llama3_tiny-sft.yaml"
    result = run_primus("train", example, "exp_name=packed", "dataloader.packing=true", "training.steps=4",
                        "validator.freq=2", "checkpoint.enable=false", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "packed"
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "derived attn_backend=sdpa, per-document causal mask" in info
    assert "packed, documents isolated" in info
    losses = [row["loss"] for row in read_metrics(run_dir)]
    assert len(losses) == 4 and all(loss == loss and loss > 0 for loss in losses), losses
    evals = read_evals(run_dir)
    assert [row["step"] for row in evals][-2:] == [2, 4] and evals[-1]["loss"] < evals[0]["loss"], evals


@pytest.mark.e2e
def test_megatron_packed_and_padded_conversations_have_the_same_per_token_losses(hf_models, tmp_path):
    """The same check through megatron-core's GPT model and the Megatron SFT dataset's block-diagonal mask."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("megatron.core")
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               str(Path(__file__).with_name("megatron_packing_worker.py")), str(hf_models("llama")), str(out)]
    result = subprocess.run(["timeout", "-k", "10", "300", *command], capture_output=True, text=True, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    measured = json.loads(out.read_text())
    print(f"megatron packed vs padded: {measured}")
    assert measured["rows"] == [1, len(CONVERSATIONS)] and measured["tokens"][0] == measured["tokens"][1] > 20
    assert measured["mean_loss"] > 1.0
    assert measured["max_abs_diff"] <= 1e-5, measured
    assert measured["causal_only_diff"] > 1e-3, measured  # the mask is what keeps them apart
