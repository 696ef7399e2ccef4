"""jsonl text -> Megatron indexed dataset (``.bin`` tokens + ``.idx`` index).

The same job as Megatron-LM's ``tools/preprocess_data.py`` (not shipped in the megatron-core
wheel), done with megatron-core's own ``IndexedDatasetBuilder`` so the files are exactly what
``GPTDataset`` reads. One document per jsonl line; an end-of-document token is appended.
"""
from __future__ import annotations

import json
from pathlib import Path

from primus.config.errors import ConfigError


def _eod_id(tokenizer, tokenizer_dir: Path) -> int:
    config = tokenizer_dir / "tokenizer_config.json"
    eos = None
    if config.exists():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
    token_id = tokenizer.token_to_id(eos) if eos else None
    return token_id if token_id is not None else tokenizer.get_vocab_size() - 1


def build_indexed_dataset(jsonl_path: str | Path, tokenizer_dir: str | Path, output_prefix: str | Path,
                          text_key: str = "text", append_eod: bool = True) -> tuple[Path, Path]:
    """Tokenize ``jsonl_path`` with ``tokenizer_dir/tokenizer.json``; write ``<prefix>.bin/.idx``."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tokenizers import Tokenizer

    jsonl_path, tokenizer_dir, output_prefix = Path(jsonl_path), Path(tokenizer_dir), Path(output_prefix)
    if not jsonl_path.exists():
        raise ConfigError(f"no such jsonl file: {jsonl_path}")
    if not (tokenizer_dir / "tokenizer.json").exists():
        raise ConfigError(f"no tokenizer.json in {tokenizer_dir}")
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eod = _eod_id(tokenizer, tokenizer_dir)
    # int32 above 65536 ids, else uint16: Megatron's own rule (GPTDatasetConfig.token_dtype_code).
    dtype = numpy.int32 if tokenizer.get_vocab_size() > numpy.iinfo(numpy.uint16).max + 1 else numpy.uint16
    output_prefix.parent.mkdir(parents=True, exist_ok=True)
    bin_path, idx_path = Path(f"{output_prefix}.bin"), Path(f"{output_prefix}.idx")
    builder = IndexedDatasetBuilder(str(bin_path), dtype=dtype)
    documents = 0
    with jsonl_path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)[text_key]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f"{jsonl_path}:{number}: not a JSON object with a '{text_key}' string") from None
            ids = tokenizer.encode(text).ids + ([eod] if append_eod else [])
            if not ids:
                continue
            builder.add_item(torch.tensor(ids, dtype=torch.int64))
            builder.end_document()
            documents += 1
    builder.finalize(str(idx_path))
    if documents == 0:
        raise ConfigError(f"{jsonl_path}: no documents with text under '{text_key}'")
    return bin_path, idx_path
