"""Shared fixtures: the learnable tiny corpus as a Megatron indexed dataset, and Megatron runs
through the real worker (``tests.helpers.train_with_torchrun``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import read_metrics, train_with_torchrun

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
    """``nproc`` ranks of the Primus worker on ``params``; the metrics.jsonl records (asserts a clean exit)."""
    result = train_with_torchrun(run_dir, "megatron", params, nproc=nproc, resume=resume, timeout=timeout,
                                 env={"PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return read_metrics(run_dir)


def write_gpt2_bpe(root: Path, texts: list[str], vocab_size: int) -> tuple[Path, Path]:
    """GPT-2-format ``vocab.json`` + ``merges.txt`` of a byte-level BPE trained on ``texts`` (Megatron-LM's
    ``--vocab-file`` / ``--merge-file``), with GPT-2's end-of-document token."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(root))
    return root / "vocab.json", root / "merges.txt"
