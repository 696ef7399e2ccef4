"""Instruction data that cannot be read is one line naming the file:line, exit 2.

The reader (``primus.data.sft``, shared by the Megatron, TorchTitan and AutoModel SFT paths)
refuses, naming file:line: an instruction that is a number or a list, bytes that are not UTF-8, a
UTF-16 file, a line nested 200 000 deep, a lone surrogate, a ``.parquet`` that is not Parquet, a
folder where one file is not UTF-8. A folder holding only a validation split is reported as such;
a held-out share that leaves nothing to train on blames the split, not the sequence length.
End to end: the same lines through ``primus train`` on Megatron and TorchTitan.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus.config.errors import ConfigError
from primus.data.sft import SFTDataSpec, build_splits, read_records, render
from tests.conftest import ROOT

GOOD = {"prompt": "What is 2 plus 3?", "response": "5"}


def _jsonl(path: Path, *lines: bytes | str | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line if isinstance(line, bytes) else
                              ((json.dumps(line) if isinstance(line, dict) else line) + "\n").encode()
                              for line in lines))
    return path


class _Tokenizer:
    """Enough of a tokenizer for rendering (no chat template: plain text)."""
    bos_token, chat_template = "", None


def _read_and_render(path: Path) -> None:
    for where, record in read_records(path):
        render(record, _Tokenizer(), "auto", where)


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        _read_and_render(path)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("record, fragment", [
    ({"instruction": 5, "output": "x"}, ":2: `instruction` must be a string, got int 5"),
    ({"instruction": ["a", "b"], "output": "x"}, ":2: `instruction` must be a string, got list"),
    ({"prompt": {"a": 1}, "response": "x"}, ":2: `prompt` must be a string, got dict"),
    ({"prompt": "a", "response": 3.5}, ":2: `response` must be a string, got float"),
])
def test_a_field_of_the_wrong_type(tmp_path, record, fragment):
    path = _jsonl(tmp_path / "data.jsonl", GOOD, record)
    assert f"{path}{fragment}" in _error(path)


@pytest.mark.parametrize("content, fragment", [
    (b'{"prompt": "caf\xe9", "response": "b"}\n', ":2: not UTF-8 text (byte 0xe9)"),
    ("[" * 200_000 + "]" * 200_000, ":2: JSON nested too deep"),
    ('{"prompt": "a\\ud800", "response": "b"}', ":2: a string holds a lone surrogate ('\\ud800')"),
    ('{"prompt": "a", "response": ' + "9" * 5000 + "}", ":2: not valid JSON"),
    ('{"prompt": "a", ', ":2: not valid JSON"),
    ("[1, 2]", ":2: expected a JSON object, got list"),
])
def test_a_line_that_is_not_a_record(tmp_path, content, fragment):
    path = _jsonl(tmp_path / "data.jsonl", GOOD, content)
    assert f"{path}{fragment}" in _error(path)


def test_a_utf16_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps(GOOD).encode("utf-16"))
    assert _error(path) == f"{path}: the file is UTF-16 text; save it as UTF-8"


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    assert [r for _, r in read_records(path)] == [GOOD]


def test_a_parquet_file_that_is_not_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text('{"prompt": "a", "response": "b"}\n')
    assert _error(path).startswith(f"{path}: not a readable Parquet file (")


def test_a_folder_where_one_file_is_not_utf8(tmp_path):
    _jsonl(tmp_path / "data" / "a.jsonl", GOOD, GOOD)
    bad = _jsonl(tmp_path / "data" / "b.jsonl", GOOD, b"\x80\x81\n")
    assert f"{bad}:2: not UTF-8 text (byte 0x80)" in _error(tmp_path / "data")


def test_a_folder_holding_only_a_validation_split(tmp_path):
    _jsonl(tmp_path / "data" / "validation.jsonl", GOOD)
    message = _error(tmp_path / "data")
    assert "holds only a validation/test split (validation.jsonl), no training records" in message


def test_a_held_out_share_that_leaves_nothing_to_train_on_blames_the_split(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", GOOD, {"prompt": "b", "response": "c"})
    with pytest.raises(ConfigError, match="valid_fraction 0.9 of 2 records holds out all of them: nothing is "
                                          "left to train on"):
        build_splits(SFTDataSpec(path=str(path), valid_fraction=0.9), _Tokenizer(), 64)


# -- end to end ----------------------------------------------------------------------------------------
MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-sft.yaml"
TORCHTITAN = ROOT / "examples" / "torchtitan" / "llama3_tiny-sft.yaml"


def _console_error(result) -> str:
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text[-3000:]
    return text


@pytest.mark.e2e
@pytest.mark.parametrize("example, key", [(MEGATRON, "sft_dataset_name"), (TORCHTITAN, "dataloader.dataset_path")])
def test_through_primus_train(example, key, run_primus, tmp_path):
    bad = _jsonl(tmp_path / "data.jsonl", *([GOOD] * 40), {"instruction": 7, "output": "x"})
    text = _console_error(run_primus("train", example, f"{key}={bad}", "exp_name=bad-sft"))
    assert text.count(f"{bad}:41: `instruction` must be a string, got int 7") == 1, text[-3000:]


@pytest.mark.e2e
def test_megatron_only_a_validation_split_is_said_before_launch(run_primus, tmp_path, workspace):
    _jsonl(tmp_path / "data" / "validation.jsonl", GOOD)
    result = run_primus("train", MEGATRON, f"sft_dataset_name={tmp_path / 'data'}")
    assert result.returncode == 2 and "holds only a validation/test split" in result.stderr, result.stderr[-2000:]
    assert not (workspace / "amd").exists()
