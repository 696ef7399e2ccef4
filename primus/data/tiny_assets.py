"""A tiny, learnable text corpus and a matching BPE tokenizer, built locally (no hub).

The corpus is generated from a small grammar, so a few-million-parameter model learns it
within tens of steps: tests use it to check that loss really goes down. The tokenizer is a
byte-level BPE in the Hugging Face ``tokenizer.json`` format that TorchTitan and Megatron
both read.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher"]
_VERBS = ["sees", "likes", "paints", "follows", "finds", "carries", "remembers"]
_OBJECTS = ["the red ball", "a green apple", "the tall tree", "an open door", "the blue sky", "a quiet river"]
_PLACES = ["in the garden", "at the station", "near the lake", "on the hill", "under the bridge"]


def tiny_corpus(n_docs: int = 2000, seed: int = 0) -> list[str]:
    """Short documents of templated sentences plus counting runs: easy to learn, not trivial."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(4, 9)):
            if rng.random() < 0.2:
                start = rng.randint(1, 50)
                sentences.append("counting " + " ".join(str(start + i) for i in range(6)) + ".")
            else:
                sentences.append(
                    f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_PLACES)}."
                )
        docs.append(" ".join(sentences))
    return docs


def build_tokenizer(texts: list[str], out_dir: Path, vocab_size: int = 512) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bar is console noise (blank lines when not a terminal)
    )
    tokenizer.train_from_iterator(texts, trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=1))
    return out_dir


def tiny_assets_dir(params: dict) -> Path | None:
    """The ``primus.tiny_assets`` folder of a module's params, if it asks for the tiny assets."""
    value = (params.get("primus") or {}).get("tiny_assets")
    return Path(value).expanduser().absolute() if value else None


BUILD_WAIT_S = 900.0  # another process building the same cache: wait this long for it


def ensure_tiny_assets(root: Path, n_docs: int = 2000) -> dict[str, Path]:
    """Create ``root/tokenizer`` and ``root/corpus/data.jsonl`` once; reuse them afterwards. Two
    experiments building one fresh cache at once: the second waits for the first (a lock)."""
    from primus.runtime.locks import exclusive

    root = Path(root)
    tokenizer_dir, corpus_dir = root / "tokenizer", root / "corpus"
    corpus_file = corpus_dir / "data.jsonl"

    def built() -> bool:
        return (tokenizer_dir / "tokenizer.json").exists() and corpus_file.exists()

    if not built():
        root.mkdir(parents=True, exist_ok=True)
        with exclusive(root / ".build.lock", what=f"the tiny assets {root}", wait_s=BUILD_WAIT_S):
            if not built():
                texts = tiny_corpus(n_docs)
                corpus_dir.mkdir(parents=True, exist_ok=True)
                tmp = corpus_file.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
                build_tokenizer(texts, tokenizer_dir)
                tmp.replace(corpus_file)  # last: its presence says the cache is whole
    return {"tokenizer": tokenizer_dir, "corpus": corpus_dir, "corpus_file": corpus_file}
