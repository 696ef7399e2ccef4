"""jsonl -> .bin/.idx with megatron-core's IndexedDatasetBuilder, read back by IndexedDataset."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")

from primus.config.errors import ConfigError
from primus.data.indexed import build_indexed_dataset


def test_build_indexed_round_trips_documents(tiny_assets, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer

    jsonl = tmp_path / "docs.jsonl"
    texts = ["the cat sees the red ball.", "", "counting 1 2 3 4 5 6."]
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    bin_path, idx_path = build_indexed_dataset(jsonl, tiny_assets["tokenizer"], tmp_path / "out" / "docs")
    assert bin_path.exists() and idx_path.exists()
    dataset = IndexedDataset(str(tmp_path / "out" / "docs"))
    tokenizer = Tokenizer.from_file(str(tiny_assets["tokenizer"] / "tokenizer.json"))
    eod = tokenizer.token_to_id("<|end_of_text|>")
    assert len(dataset) == 3  # the empty document still gets its end-of-document token
    assert list(dataset[0]) == tokenizer.encode(texts[0]).ids + [eod]
    assert list(dataset[1]) == [eod]
    assert dataset[0].dtype.name == "uint16"  # 512-token vocabulary: Megatron's uint16 rule


def test_bad_jsonl_line_is_a_config_error(tiny_assets, tmp_path):
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "ok"}\n{"body": "no text key"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not a JSON object with a 'text' string"):
        build_indexed_dataset(jsonl, tiny_assets["tokenizer"], tmp_path / "bad")


def test_build_indexed_cli_action(tiny_assets, tmp_path, capsys):
    """`primus data build-indexed` (registered through primus.backends.megatron.data_cli)."""
    import argparse

    from primus.backends.megatron import data_cli

    parser = argparse.ArgumentParser()
    data_cli.register(parser.add_subparsers())
    args = parser.parse_args(["build-indexed", str(tiny_assets["corpus_file"]), "--tokenizer",
                              str(tiny_assets["tokenizer"]), "--output-prefix", str(tmp_path / "corpus")])
    assert args.handler(args, []) == 0
    assert (tmp_path / "corpus.bin").stat().st_size > 0 and (tmp_path / "corpus.idx").exists()
    assert f"data_path: [{tmp_path / 'corpus'}]" in capsys.readouterr().out
