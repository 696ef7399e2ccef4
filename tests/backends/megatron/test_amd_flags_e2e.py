"""The Megatron-LM arguments wired for AMD's files and Megatron-LM's own scripts, in real megatron-core
runs on CPU: a GPT-2-style model on GPT-2 BPE data read cyclically with a sample-based schedule and
per-token loss; finetuning from ``pretrained_checkpoint``; attention sinks and sliding windows;
``exit_duration_in_mins``."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.backends.megatron.conftest import REPO, run_megatron, write_gpt2_bpe
from tests.helpers import exit_code_in_process, read_metrics

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e



TEXT = [f"document {i}: the quick brown fox jumps over the lazy dog and the dog sleeps" for i in range(200)]


@pytest.fixture(scope="module")
def gpt2_data(tmp_path_factory):
    """GPT-2 BPE files and a .bin/.idx corpus tokenized with them (Megatron-LM's preprocess_data output)."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from primus.backends.megatron.tokenizers import GPT2BPETokenizer

    root = tmp_path_factory.mktemp("gpt2_data")
    tokenizer = GPT2BPETokenizer(*map(str, write_gpt2_bpe(root, TEXT, vocab_size=320)))
    builder = IndexedDatasetBuilder(str(root / "corpus_text_document.bin"), dtype=__import__("numpy").uint16)
    for text in TEXT:
        builder.add_item(torch.tensor(tokenizer.tokenize(text) + [tokenizer.eod], dtype=torch.int64))
        builder.end_document()
    builder.finalize(str(root / "corpus_text_document.idx"))
    return root


def test_gpt2_bpe_cyclic_data_sample_schedule_and_per_token_loss(gpt2_data, tmp_path):
    params = {  # GPT-3's shape, shrunk: learned positions, LayerNorm, GeLU, biases (Megatron-LM's defaults)
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "max_position_embeddings": 32, "micro_batch_size": 2, "global_batch_size": 4,
        "train_samples": 24, "lr_warmup_samples": 8, "lr": 1e-3, "min_lr": 1e-4, "lr_decay_style": "cosine",
        "data_path": [str(gpt2_data / "corpus_text_document")], "split": "98,2,0",
        "tokenizer_type": "GPT2BPETokenizer", "vocab_file": str(gpt2_data / "vocab.json"),
        "merge_file": str(gpt2_data / "merges.txt"), "dataloader_type": "cyclic",
        "calculate_per_token_loss": True, "enable_experimental": True, "eval_interval": None, "seed": 1234,
    }
    records = run_megatron(tmp_path / "gpt2", params)
    assert [r["step"] for r in records] == list(range(1, 7))  # 24 samples / 4 per step
    lrs = [r["lr"] for r in records]
    assert lrs[0] < lrs[1] < lrs[2] and lrs[2] > lrs[-1]  # warm-up over 8 samples (2 steps), then decay
    assert all(r["loss"] == r["loss"] for r in records) and records[-1]["loss"] < records[0]["loss"]
    log = "\n".join(p.read_text() for p in (tmp_path / "gpt2" / "logs").rglob("info.log"))
    assert "derived train_iters=6 (train_samples / global_batch_size" in log
    assert "padded_vocab_size=384" in log  # the GPT-2 vocabulary (320) read from vocab.json, padded to 128s


@pytest.fixture(scope="module")
def llama(tiny_assets, tiny_indexed):
    model = yaml.safe_load((REPO / "primus/configs/models/common/llama3_tiny.yaml").read_text())["model"]
    return {"model": model, "seq_length": 64, "max_position_embeddings": 64, "tokenizer_type": "HuggingFaceTokenizer",
            "tokenizer_model": str(tiny_assets["tokenizer"]), "data_path": [str(tiny_indexed)], "split": "98,2,0",
            "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 4, "lr": 3e-3, "min_lr": 3e-4,
            "lr_warmup_iters": 1, "eval_interval": None, "seed": 1234}


def test_finetuning_from_pretrained_checkpoint_starts_at_iteration_zero_from_its_weights(llama, tmp_path):
    base = run_megatron(tmp_path / "base", {**llama, "train_iters": 6})
    tuned = run_megatron(tmp_path / "tuned", {**llama, "train_iters": 2,
                                              "pretrained_checkpoint": str(tmp_path / "base" / "checkpoints")})
    assert [r["step"] for r in tuned] == [1, 2]  # iteration 0: finetune, not resume
    assert tuned[0]["loss"] < base[0]["loss"] - 0.5  # from the trained weights, not a fresh init
    log = "\n".join(p.read_text() for p in (tmp_path / "tuned" / "logs").rglob("info.log"))
    assert "derived pretrained_checkpoint=" in log and "finetuning from it" in log


def test_attention_sinks_and_sliding_windows_change_the_math(llama, tmp_path):
    plain = run_megatron(tmp_path / "plain", llama)
    sinks = run_megatron(tmp_path / "sinks", {**llama, "softmax_type": "learnable", "window_size": [8, 0],
                                              "window_attn_skip_freq": 2})
    assert len(sinks) == 4 and all(r["loss"] == r["loss"] for r in sinks)
    assert [r["loss"] for r in sinks] != [r["loss"] for r in plain]
    checkpoint = json.dumps(sorted(p.name for p in (tmp_path / "sinks" / "checkpoints").rglob("*")))
    assert "iter_0000004" in checkpoint


def test_exit_duration_checkpoints_and_stops_as_a_preemption(llama, tmp_path, monkeypatch):
    """Megatron-LM's minutes are whole: a run that started more than one minute ago stops at its next step.
    The trainer's start is put 61 s in the past (its clock is the real one), so the minute need not be
    spent training."""
    from primus.backends.megatron.trainer import MegatronTrainer
    from primus.runtime.rundir import ExitCode

    init = MegatronTrainer.__init__

    def started_a_minute_ago(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.started -= 61

    monkeypatch.setattr(MegatronTrainer, "__init__", started_a_minute_ago)
    code = exit_code_in_process(tmp_path / "timed", "megatron", {**llama, "exit_duration_in_mins": 1,
                                                                 "train_iters": 100000})
    assert code == ExitCode.PREEMPTED
    marker = tmp_path / "timed" / "preempted.json"  # the launcher turns it into exit 75: the same command resumes
    assert marker.exists()
    stopped = json.loads(marker.read_text())
    assert stopped["checkpointed"] and 1 <= stopped["step"] < 100000
    assert [r["step"] for r in read_metrics(tmp_path / "timed")] == list(range(1, stopped["step"] + 1))
    assert (tmp_path / "timed" / "checkpoints" / f"iter_{stopped['step']:07d}").is_dir()
