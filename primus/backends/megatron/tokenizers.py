"""Megatron-LM's tokenizer types that read local files, and the vocabulary a plan can know without them.

| ``tokenizer_type`` | files | built with |
|---|---|---|
| ``HuggingFaceTokenizer`` | ``tokenizer_model``: a folder with ``tokenizer.json`` (or the file) | ``tokenizers`` |
| ``GPT2BPETokenizer`` | ``vocab_file`` (GPT-2's ``vocab.json``) + ``merge_file`` (``merges.txt``) | ``tokenizers``' byte-level BPE |
| ``Llama2Tokenizer``, ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer`` | ``tokenizer_model``: a sentencepiece ``.model`` | megatron-core's SentencePieceTokenizer |
| ``TikTokenizer`` | ``tokenizer_model``: a tiktoken vocabulary ``.json`` | megatron-core's TikTokenTokenizer |
| ``NullTokenizer`` | none (``vocab_size``) | here |

GPT-2's BPE does not go through megatron-core 0.16.1's ``MegatronHFTokenizer``: it resolves the name
``gpt2`` on the Hugging Face Hub and passes the vocabulary as the merges file (``vocab_file`` twice;
Megatron-LM d3528a2 has the same code), so it cannot read local files offline. The same byte-level BPE is
built from the two files directly; EOD is ``<|endoftext|>`` as in Megatron-LM's legacy ``_GPT2BPETokenizer``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError

SENTENCEPIECE = ("Llama2Tokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer")
TIKTOKEN_DEFAULT_VOCAB = 2**17  # megatron-core's DEFAULT_TIKTOKEN_MAX_VOCAB: TikTokenizer's size without vocab_size
# The vocabulary a named tokenizer is published with, for a plan made before its files are here (a run reads
# the files). GPT-2: openai/gpt-2's encoder.json (50,257 tokens); Llama 2 (and Mistral/Mixtral): the
# 32,000-piece sentencepiece model published with meta-llama/Llama-2-7b.
PUBLISHED_VOCAB = {"GPT2BPETokenizer": (50257, "GPT-2's published BPE vocabulary"),
                   "Llama2Tokenizer": (32000, "Llama 2's published sentencepiece vocabulary")}


def files_of(args) -> list[tuple[str, str]]:
    """(key, path) of every local file the tokenizer reads (``check_inputs`` checks they exist)."""
    if args.tokenizer_type == "GPT2BPETokenizer":
        return [(key, getattr(args, key)) for key in ("vocab_file", "merge_file")]
    if args.tokenizer_type in (*SENTENCEPIECE, "TikTokenizer", "HuggingFaceTokenizer") and args.tokenizer_model:
        return [("tokenizer_model", args.tokenizer_model)]
    return []


def required_keys(tokenizer_type: str | None) -> tuple[str, ...]:
    """The arguments a tokenizer type cannot do without (checked by ``config validate``)."""
    if tokenizer_type == "GPT2BPETokenizer":
        return ("vocab_file", "merge_file")
    if tokenizer_type in (*SENTENCEPIECE, "TikTokenizer", "HuggingFaceTokenizer"):
        return ("tokenizer_model",)
    return ()  # NullTokenizer's vocab_size may come from the tokenizer-free model preset: said when the run starts


def plan_vocab(args) -> tuple[int | None, str]:
    """(vocabulary size, where it came from) for a plan, without building the tokenizer: ``vocab_size``,
    else read from the tokenizer's file when it is here, else a named tokenizer's published size;
    (None, why) when unknown."""
    if args.vocab_size:
        return args.vocab_size, "vocab_size"
    kind = args.tokenizer_type
    if kind == "TikTokenizer":
        return TIKTOKEN_DEFAULT_VOCAB, "TikTokenizer's default vocabulary size (megatron-core; vocab_size sets it)"
    files = files_of(args)
    if files and all(path and Path(path).exists() for _, path in files):
        try:
            return _vocab_from_files(kind, args), f"read from {files[0][1]}"
        except Exception as exc:  # noqa: BLE001 - a file the plan cannot read: the run reads it (and says why)
            reason = f"{files[0][1]} could not be read here ({type(exc).__name__})"
    else:
        missing = next((path for _, path in files if not path or not Path(path).exists()), None)
        reason = f"{kind}'s {missing or 'file'} is not here" if kind else "no tokenizer_type"
    if kind in PUBLISHED_VOCAB:
        size, what = PUBLISHED_VOCAB[kind]
        return size, f"{what}: {reason}"
    return None, reason


def _vocab_from_files(kind: str, args) -> int:
    if kind == "GPT2BPETokenizer":
        return len(json.loads(Path(args.vocab_file).read_text(encoding="utf-8")))
    if kind in SENTENCEPIECE:
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=str(args.tokenizer_model)).get_piece_size()
    if kind == "HuggingFaceTokenizer":
        return HFTokenizer(args.tokenizer_model).vocab_size
    raise ValueError(kind)


class HFTokenizer:
    """The slice of Megatron's tokenizer interface GPTDataset uses, over a HF ``tokenizer.json``."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        directory = Path(path) if Path(path).is_dir() else Path(path).parent
        file = directory / "tokenizer.json" if Path(path).is_dir() else Path(path)
        if not file.exists():
            raise ConfigError(f"tokenizer_model: no tokenizer.json at {file}")
        self._tokenizer = Tokenizer.from_file(str(file))
        self.vocab_size = self._tokenizer.get_vocab_size()
        eos = None
        config = directory / "tokenizer_config.json"
        if config.exists():
            eos = json.loads(config.read_text()).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
        eod = self._tokenizer.token_to_id(eos) if eos else None
        self.eod = eod if eod is not None else self.vocab_size - 1
        # GPTDataset hashes this into its index-cache file names (as MegatronLegacyTokenizer does).
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer_path": [str(file)]}

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids


class GPT2BPETokenizer:
    """GPT-2's byte-level BPE from ``vocab.json`` + ``merges.txt`` (Megatron-LM's ``--vocab-file`` / ``--merge-file``)."""

    def __init__(self, vocab_file: str, merge_file: str):
        from tokenizers import ByteLevelBPETokenizer

        self._tokenizer = ByteLevelBPETokenizer(vocab_file, merge_file)  # GPT-2's byte-level BPE, no prefix space
        vocab = self._tokenizer.get_vocab()
        self.vocab_size = len(vocab)
        if "<|endoftext|>" not in vocab:
            raise ConfigError(f"vocab_file: {vocab_file} has no <|endoftext|> token (GPT-2's end of document)")
        self.eod = vocab["<|endoftext|>"]
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer_path": [vocab_file, merge_file]}

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids


class NullTokenizer:
    """Megatron-LM's NullTokenizer: no text, only a vocabulary size (mock data); EOD is the last id."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.unique_identifiers = {"class": type(self).__name__, "vocab_size": vocab_size}


def _megatron_core(library: str, path: str, **kwargs: Any):
    """A megatron-core tokenizer (``megatron.core.tokenizers``) of ``library`` over a local file."""
    from megatron.core.tokenizers import MegatronTokenizer

    try:
        return MegatronTokenizer.from_pretrained(tokenizer_path=path, metadata_path={"library": library}, **kwargs)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"tokenizer_type: the {library} package is not installed ({exc.name}); "
                          f"`pip install {library}` (requirements/megatron.txt pins it)") from None


def build_tokenizer(args):
    """The tokenizer of ``args.tokenizer_type``, as Megatron-LM builds it (d3528a2's
    ``megatron.core.tokenizers.utils.build_tokenizer``), from local files only."""
    kind = args.tokenizer_type
    if kind == "HuggingFaceTokenizer":
        return HFTokenizer(args.tokenizer_model)
    if kind == "GPT2BPETokenizer":
        return GPT2BPETokenizer(args.vocab_file, args.merge_file)
    if kind in SENTENCEPIECE:
        return _megatron_core("sentencepiece", args.tokenizer_model, legacy=args.tokenizer_sentencepiece_legacy,
                              special_tokens=args.tokenizer_special_tokens)
    if kind == "TikTokenizer":
        return _megatron_core("tiktoken", args.tokenizer_model, pattern=args.tiktoken_pattern or "v2",
                              vocab_size=args.vocab_size or TIKTOKEN_DEFAULT_VOCAB,
                              num_special_tokens=args.tiktoken_num_special_tokens,
                              special_tokens=args.tokenizer_special_tokens)
    if args.vocab_size is None:
        raise ConfigError("vocab_size: required with tokenizer_type: NullTokenizer / mock_data (or give a model: preset)")
    return NullTokenizer(args.vocab_size)
