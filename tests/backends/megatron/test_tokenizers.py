"""Megatron-LM's tokenizer types that read local files (primus/backends/megatron/tokenizers.py), each
built from a tiny file made here, and the vocabulary a plan knows without them."""
from __future__ import annotations

import base64
import json

import pytest

from primus.backends.megatron.arguments import parse_args
from primus.backends.megatron.tokenizers import build_tokenizer, files_of, plan_vocab
from primus.config.errors import ConfigError
from tests.backends.megatron.conftest import write_gpt2_bpe

TEXT = ["the quick brown fox jumps over the lazy dog", "a tiny corpus for a tiny tokenizer",
        "megatron reads local tokenizer files", "the dog sleeps; the fox runs"] * 8
BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "train_iters": 2, "lr": 1e-3,
        "micro_batch_size": 1, "data_path": ["/data/corpus_text_document"]}


def args_of(**tokenizer):
    return parse_args({**BASE, **tokenizer})


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    return write_gpt2_bpe(tmp_path_factory.mktemp("gpt2"), TEXT, vocab_size=300)


def test_gpt2_bpe_reads_vocab_and_merges(gpt2_files):
    vocab, merges = gpt2_files
    args = args_of(tokenizer_type="GPT2BPETokenizer", vocab_file=str(vocab), merge_file=str(merges))
    tokenizer = build_tokenizer(args)
    entries = json.loads(vocab.read_text())
    assert tokenizer.vocab_size == len(entries) and tokenizer.eod == entries["<|endoftext|>"]
    ids = tokenizer.tokenize("the quick brown fox")
    assert ids and all(0 <= i < tokenizer.vocab_size for i in ids)
    assert len(ids) < len("the quick brown fox")  # merges were applied (a byte-per-token split would not)
    assert plan_vocab(args) == (len(entries), f"read from {vocab}")
    assert files_of(args) == [("vocab_file", str(vocab)), ("merge_file", str(merges))]


def test_sentencepiece_types_read_a_model_file(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_prefix=str(tmp_path / "sp"),
                                             vocab_size=60, model_type="bpe", bos_id=1, eos_id=2, unk_id=0)
    model = tmp_path / "sp.model"
    for kind in ("Llama2Tokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer"):
        args = args_of(tokenizer_type=kind, tokenizer_model=str(model))
        tokenizer = build_tokenizer(args)
        assert tokenizer.vocab_size == 60 and tokenizer.eod == 2, kind
        ids = tokenizer.tokenize("the lazy dog")
        assert ids and all(0 <= i < 60 for i in ids)
        assert plan_vocab(args) == (60, f"read from {model}")


def test_tiktoken_reads_a_rank_file(tmp_path):
    pytest.importorskip("tiktoken")
    ranks = [bytes([i]) for i in range(256)] + [b"th", b"the", b" the", b"fo", b"fox"]
    file = tmp_path / "tiktoken.json"
    file.write_text(json.dumps([{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": repr(t)}
                                for i, t in enumerate(ranks)]))
    args = args_of(tokenizer_type="TikTokenizer", tokenizer_model=str(file), vocab_size=10 + len(ranks),
                   tiktoken_num_special_tokens=10, tiktoken_pattern="v2")
    tokenizer = build_tokenizer(args)
    assert tokenizer.vocab_size == 10 + len(ranks) and tokenizer.eod == 2  # </s>, Megatron's special tokens
    ids = tokenizer.tokenize("the fox")
    assert 10 + ranks.index(b"the") in ids and 10 + ranks.index(b"fox") in ids  # merged tokens, shifted by 10
    assert plan_vocab(args)[0] == 10 + len(ranks)


def test_huggingface_and_null_tokenizers(tmp_path):
    from primus.data.tiny_assets import build_tokenizer as build_tiny

    directory = build_tiny(TEXT, tmp_path / "hf", vocab_size=128)
    args = args_of(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(directory))
    tokenizer = build_tokenizer(args)
    assert plan_vocab(args) == (tokenizer.vocab_size, f"read from {directory}")
    null = build_tokenizer(parse_args({**BASE, "data_path": None, "mock_data": True, "tokenizer_type": "NullTokenizer",
                                       "vocab_size": 100}))
    assert (null.vocab_size, null.eod) == (100, 99)


def test_a_plan_without_the_files_takes_a_published_vocabulary_or_says_it_is_unknown(tmp_path):
    missing = str(tmp_path / "absent")
    size, why = plan_vocab(args_of(tokenizer_type="GPT2BPETokenizer", vocab_file=missing, merge_file=missing))
    assert size == 50257 and why == f"GPT-2's published BPE vocabulary: GPT2BPETokenizer's {missing} is not here"
    assert plan_vocab(args_of(tokenizer_type="Llama2Tokenizer", tokenizer_model=missing))[0] == 32000
    size, why = plan_vocab(args_of(tokenizer_type="SentencePieceTokenizer", tokenizer_model=missing))
    assert size is None and why == f"SentencePieceTokenizer's {missing} is not here"
    assert plan_vocab(args_of(tokenizer_type="TikTokenizer", tokenizer_model=missing))[0] == 2**17
    assert plan_vocab(args_of(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=missing, vocab_size=77)) == \
        (77, "vocab_size")


def test_each_file_tokenizer_names_the_file_it_needs_at_validate():
    for kind, key in (("GPT2BPETokenizer", "vocab_file"), ("Llama2Tokenizer", "tokenizer_model"),
                      ("TikTokenizer", "tokenizer_model")):
        with pytest.raises(ConfigError) as exc:
            args_of(tokenizer_type=kind)
        assert str(exc.value) == f"modules.pre_trainer.{key}: required with tokenizer_type: {kind}"
