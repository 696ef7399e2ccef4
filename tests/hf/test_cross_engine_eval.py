"""Same weights, same validation tokens -> the same validation loss on Megatron and TorchTitan (fp32).

Both engines start from one Hugging Face checkpoint with the ``llama3_tiny`` preset's network
(``primus.hf.tiny``; the preset is named on both so each builds that network itself and loads the
checkpoint through its own importer), and both read one validation set: the held-out split of
the tiny instruction data, tokenized and laid out by ``primus.data.sft`` for both. One training
step that changes no weight (Megatron: lr 0; TorchTitan: gradients clipped to norm 0, no weight
decay) is followed by one evaluation of the same 4 sequences through each engine's own
validation path (Megatron's ``evaluate``, TorchTitan's ``Validator``), recorded as ``[EVAL]`` rows.

Pinned so that the engines are comparable at all (each is a real difference between them):
- initialisation: irrelevant here, the weights are the checkpoint's (TorchTitan's own embedding
  init is N(0, 1), Megatron's N(0, 0.02));
- untied embeddings and RoPE theta 500000 come from the preset on both;
- fp32 on both: Megatron ``bf16: false``; TorchTitan ``mixed_precision_param: float32`` (FSDP2
  otherwise computes in bf16 on a CPU with AVX512-BF16/AMX);
- one evaluation batch of the same rows: both average the loss over the batch's response tokens.
"""
from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.helpers import read_evals

pytestmark = [pytest.mark.e2e]
BATCH, SEQ = 4, 64

MEGATRON = (ROOT / "examples" / "megatron" / "llama3_tiny-sft.yaml", [
    "train_iters=1", "lr=0", "min_lr=0", "lr_warmup_iters=0", "save_interval=100", "eval_interval=1", "eval_iters=1",
    f"micro_batch_size={BATCH}", f"global_batch_size={BATCH}", f"seq_length={SEQ}", "bf16=false"])
TORCHTITAN = (ROOT / "examples" / "torchtitan" / "llama3_tiny-sft.yaml", [
    "training.steps=1", "training.max_norm=0", "optimizer.weight_decay=0", "checkpoint.interval=100",
    "validator.freq=1", "validator.steps=1", f"training.local_batch_size={BATCH}", f"training.seq_len={SEQ}",
    "training.mixed_precision_param=float32"])
PACKING = {"megatron": "enable_packed_sequences={}", "torchtitan": "dataloader.packing={}"}


def _validation_loss(run_primus, workspace, example, overrides, packing: bool) -> tuple[float, str]:
    """The run's one validation loss, and its log line of what the validation split holds."""
    backend = example.parent.name
    name = f"eval-{backend}-{'packed' if packing else 'padded'}"
    result = run_primus("train", example, f"exp_name={name}", "modules.pre_trainer.model=llama3_tiny.yaml",
                        PACKING[backend].format(str(packing).lower()), *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / name
    evals = read_evals(run_dir)
    assert [row["step"] for row in evals] == [1], evals
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    split = next(line[line.index("SFT valid:"):] for line in info.splitlines() if "SFT valid:" in line)
    return evals[0]["loss"], split


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_megatron_and_torchtitan_give_the_same_validation_loss(packing, run_primus, workspace):
    pytest.importorskip("transformers")
    megatron, megatron_split = _validation_loss(run_primus, workspace, *MEGATRON, packing)
    titan, titan_split = _validation_loss(run_primus, workspace, *TORCHTITAN, packing)
    assert megatron_split == titan_split  # the same conversations, laid out into the same sequences
    print(f"validation loss ({'packed' if packing else 'padded'}): megatron {megatron:.8f} torchtitan {titan:.8f} "
          f"|diff| {abs(megatron - titan):.3g}")
    assert 3.0 < megatron < 10.0  # a random 512-token model: about ln(512) = 6.2, not a degenerate value
    assert abs(megatron - titan) <= 1e-4, (megatron, titan)
