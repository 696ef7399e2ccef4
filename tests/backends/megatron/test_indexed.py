"""`primus data build-indexed`: a corpus (JSON Lines, Parquet, a saved HF dataset) -> .bin/.idx that
megatron-core's IndexedDataset reads back; same input -> byte-identical files for any number of
workers; bad records counted per file, and too many of them refuse the build with nothing written."""
from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("megatron.core")

from primus.config.errors import ConfigError
from primus.data.indexed import build_indexed, build_indexed_dataset, report_lines

TEXTS = ["the cat sees the red ball.", "counting 1 2 3 4 5 6.", "a dog runs to the blue house and back."]


def _digest(prefix) -> str:
    return hashlib.sha256(open(f"{prefix}.bin", "rb").read() + open(f"{prefix}.idx", "rb").read()).hexdigest()


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_build_indexed_round_trips_documents(tiny_assets, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer

    jsonl = _jsonl(tmp_path / "docs.jsonl", TEXTS)
    bin_path, idx_path = build_indexed_dataset(jsonl, tiny_assets["tokenizer"], tmp_path / "out" / "docs")
    assert bin_path.exists() and idx_path.exists()
    dataset = IndexedDataset(str(tmp_path / "out" / "docs"))
    tokenizer = Tokenizer.from_file(str(tiny_assets["tokenizer"] / "tokenizer.json"))
    eod = tokenizer.token_to_id("<|end_of_text|>")
    assert [list(dataset[i]) for i in range(len(dataset))] == [tokenizer.encode(t).ids + [eod] for t in TEXTS]
    assert list(dataset.document_indices) == [0, 1, 2, 3]  # one sequence per document
    assert dataset[0].dtype.name == "uint16"  # 512-token vocabulary: megatron-core's DType.optimal_dtype


def test_same_input_gives_byte_identical_files_for_any_worker_count(tiny_assets, tmp_path, monkeypatch):
    import primus.data.corpus as corpus

    monkeypatch.setattr(corpus, "SHARD_BYTES", 4096)  # many shards, spread over the workers
    jsonl = tiny_assets["corpus_file"]
    one = build_indexed([jsonl], tiny_assets["tokenizer"], tmp_path / "one", workers=1, progress=False)
    again = build_indexed([jsonl], tiny_assets["tokenizer"], tmp_path / "again", workers=1, progress=False)
    two = build_indexed([jsonl], tiny_assets["tokenizer"], tmp_path / "two", workers=2, progress=False)
    assert len(corpus.plan_shards(jsonl, "jsonl")) > 10
    assert _digest(tmp_path / "one") == _digest(tmp_path / "again") == _digest(tmp_path / "two")
    assert one.documents == two.documents == len(jsonl.read_text().splitlines()) and one.bad == 0


def test_parquet_and_a_saved_dataset_give_the_jsonl_files(tiny_assets, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from datasets import Dataset

    _jsonl(tmp_path / "docs.jsonl", TEXTS)
    pq.write_table(pa.table({"text": TEXTS[:2]}), tmp_path / "a.parquet", row_group_size=1)  # two row groups
    pq.write_table(pa.table({"text": TEXTS[2:]}), tmp_path / "b.parquet")
    Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "saved"))
    for name, inputs in (("jsonl", [tmp_path / "docs.jsonl"]), ("parquet", [tmp_path / "a.parquet", tmp_path / "b.parquet"]),
                         ("saved", [tmp_path / "saved"])):
        build_indexed(inputs, tiny_assets["tokenizer"], tmp_path / "out" / name, progress=False)
    assert _digest(tmp_path / "out" / "jsonl") == _digest(tmp_path / "out" / "parquet") == _digest(tmp_path / "out" / "saved")


def _bad_corpus(path):
    good = [json.dumps({"text": t}) for t in TEXTS * 100]
    lines = good[:100] + [
        '{"text": "caf\xe9"}'.encode("latin-1").decode("latin-1"),  # written below as latin-1 bytes: not UTF-8
        json.dumps({"text": ""}),  # empty document
        json.dumps({"body": "no text key"}),
        json.dumps({"text": "x" * 300}),  # over --max-line-bytes 256
        "not json at all",
    ] + good[100:]
    with path.open("wb") as out:
        for i, line in enumerate(lines):
            out.write(line.encode("latin-1" if i == 100 else "utf-8") + b"\n")
    return path


def test_bad_records_are_counted_and_named_per_file(tiny_assets, tmp_path):
    corpus = _bad_corpus(tmp_path / "bad.jsonl")
    result = build_indexed([corpus, _jsonl(tmp_path / "good.jsonl", TEXTS)], tiny_assets["tokenizer"],
                           tmp_path / "out", max_line_bytes=256, max_bad_fraction=0.05, progress=False)
    bad, good = result.files
    assert dict(bad.bad) == {"not UTF-8": 1, "empty document": 1, "no text key": 1, "line over the size limit": 1,
                             "not JSON": 1}
    assert bad.examples == [f"{corpus}:101: not UTF-8", f"{corpus}:102: empty document", f"{corpus}:103: no text key",
                            f"{corpus}:104: line over the size limit", f"{corpus}:105: not JSON"]
    assert (bad.documents, good.documents, good.bad_count, result.records) == (300, 3, 0, 308)
    lines = report_lines(result)
    assert lines[0] == f"{corpus}: 300 documents, {bad.tokens} tokens, bad records: 1 not UTF-8; 1 empty document; " \
                       "1 no text key; 1 line over the size limit; 1 not JSON"
    assert lines[-1].startswith("total: 303 documents") and "5 of 308 records bad" in lines[-1]


def test_too_many_bad_records_refuse_the_build_and_write_nothing(tiny_assets, tmp_path):
    corpus = _bad_corpus(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match=r"5 of 305 records are bad \(1\.64% > the allowed 1\.00%.*bad\.jsonl: "
                                          r"1 not UTF-8.*\(first: .*bad\.jsonl:101: not UTF-8\); nothing written"):
        build_indexed([corpus], tiny_assets["tokenizer"], tmp_path / "out", max_line_bytes=256, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_build_indexed_cli(tiny_assets, tmp_path, capsys):
    """`primus data build-indexed`: the per-file report and data_path; bad input is one line, exit 2."""
    from primus.cli.main import main

    code = main(["data", "build-indexed", str(tiny_assets["corpus_file"]), "--tokenizer", str(tiny_assets["tokenizer"]),
                 "--output-prefix", str(tmp_path / "corpus"), "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "corpus.bin").stat().st_size > 0 and (tmp_path / "corpus.idx").exists()
    assert f"data_path: [{tmp_path / 'corpus'}]" in out and "bad records: none" in out
    code = main(["data", "build-indexed", str(_bad_corpus(tmp_path / "bad.jsonl")), "--tokenizer",
                 str(tiny_assets["tokenizer"]), "--output-prefix", str(tmp_path / "bad"), "--workers", "1",
                 "--max-line-bytes", "256"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("primus: error: 5 of 305 records are bad")
    assert not list(tmp_path.glob("bad.*.partial")) and not (tmp_path / "bad.bin").exists()
