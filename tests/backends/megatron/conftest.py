"""Shared fixtures: the learnable tiny corpus as a Megatron indexed dataset, and Megatron runs
through the real worker (``tests.helpers.train_with_torchrun``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture(scope="module")
def base(tiny_assets, tiny_indexed, request):
    """The tiny Llama on the learnable corpus, fp32; ``train_iters`` is the test module's ``STEPS``."""
    model = yaml.safe_load((REPO / "primus/configs/models/common/llama3_tiny.yaml").read_text())["model"]
    return {
        "model": model, "seq_length": 64, "max_position_embeddings": 64,
        "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(tiny_assets["tokenizer"]),
        "data_path": [str(tiny_indexed)], "split": "98,2,0",
        "micro_batch_size": 4, "global_batch_size": 8, "train_iters": request.module.STEPS,
        "lr": 3e-3, "min_lr": 3e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine",
        "eval_interval": None, "log_interval": 1, "seed": 1234,
    }


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    """name -> metrics records; each run launched at most once per module. ``resume_from=(run, N)``
    starts from a copy of that run's ``iter_N`` (the source run must have been launched first)."""
    root = tmp_path_factory.mktemp("megatron_runs")
    cache: dict[str, list[dict]] = {}

    def get(name: str, nproc: int, resume_from: tuple[str, int] | None = None, **overrides):
        if name not in cache:
            run_dir = root / name
            if resume_from is not None:
                source, iteration = resume_from
                get(source, nproc)  # make sure the source run exists
                checkpoints = run_dir / "checkpoints"
                checkpoints.mkdir(parents=True)
                shutil.copytree(root / source / "checkpoints" / f"iter_{iteration:07d}",
                                checkpoints / f"iter_{iteration:07d}")
                (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(iteration))
            cache[name] = run_megatron(run_dir, {**base, **overrides}, nproc=nproc, resume=resume_from is not None)
            cache[name + ":dir"] = run_dir
        return cache[name]

    get.root, get.base = root, base
    return get


def losses(records):
    return [r["loss"] for r in records]


def write_gpt2_bpe(root: Path, texts: list[str], vocab_size: int) -> tuple[Path, Path]:
    """GPT-2-format ``vocab.json`` + ``merges.txt`` of a byte-level BPE trained on ``texts`` (Megatron-LM's
    ``--vocab-file`` / ``--merge-file``), with GPT-2's end-of-document token."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(root))
    return root / "vocab.json", root / "merges.txt"
