"""Instruction data: the response-only mask on known examples, padding vs packing, splits, bad records."""
from __future__ import annotations

import json

import pytest

from primus.config.errors import ConfigError

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(hf_models):
    from primus.data.sft import load_tokenizer

    return load_tokenizer(hf_models("llama"))


def _supervised_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, s in zip(example.tokens, example.supervised) if s])


def test_response_only_mask_on_a_known_prompt_response(tokenizer):
    from primus.data.sft import tokenize

    example = tokenize({"prompt": "What is 2 plus 3?", "response": "2 plus 3 is 5."}, tokenizer)
    assert tokenizer.decode(example.tokens) == (
        "<|begin_of_text|><|user|>What is 2 plus 3?<|end|><|assistant|>2 plus 3 is 5.<|end|><|end_of_text|>")
    # exactly the answer, its end-of-turn marker and the end of sequence carry the loss
    assert _supervised_text(tokenizer, example) == "2 plus 3 is 5.<|end|><|end_of_text|>"
    first = example.supervised.index(True)
    assert tokenizer.decode(example.tokens[:first]).endswith("<|assistant|>") and all(example.supervised[first:])


def test_multi_turn_messages_supervise_every_assistant_turn_only(tokenizer):
    from primus.data.sft import tokenize

    record = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
                           {"role": "assistant", "content": "Goodbye."}]}
    example = tokenize(record, tokenizer)
    assert _supervised_text(tokenizer, example) == "Hello.<|end|>Goodbye.<|end|><|end_of_text|>"


@pytest.mark.parametrize("fmt, head, learned", [
    ("alpaca", "### Response:\n", "2.<|end_of_text|>"),
    ("chatml", "<|im_start|>assistant\n", "2.<|im_end|><|end_of_text|>"),
    ("plain", "What is 1 plus 1?", "2.<|end_of_text|>"),
])
def test_text_formats_mask_the_prompt(tokenizer, fmt, head, learned):
    from primus.data.sft import tokenize

    example = tokenize({"instruction": "What is 1 plus 1?", "output": "2."}, tokenizer, fmt)
    text = tokenizer.decode(example.tokens)
    assert text.startswith("<|begin_of_text|>") and head in text
    assert _supervised_text(tokenizer, example) == learned


def test_labels_are_shifted_and_padding_carries_no_loss(tokenizer):
    from primus.data.sft import IGNORE_INDEX, build_sequences, tokenize

    examples = [tokenize({"prompt": f"What is {i} plus 1?", "response": f"{i + 1}."}, tokenizer) for i in range(3)]
    rows, dropped = build_sequences(examples, seq_len=48, pad_id=tokenizer.pad_token_id, packing=False)
    assert dropped == 0 and len(rows) == 3 and all(len(r) == 48 for r in rows)
    row, example = rows[0], examples[0]
    n = len(example.tokens) - 1
    assert row.inputs[:n] == example.tokens[:-1]
    assert [l for l in row.labels[:n] if l != IGNORE_INDEX] == [t for t, s in zip(example.tokens[1:], example.supervised[1:]) if s]
    assert set(row.labels[n:]) == {IGNORE_INDEX} and set(row.inputs[n:]) == {tokenizer.pad_token_id}
    assert row.positions[:n] == list(range(n))


def test_packing_keeps_documents_apart_and_drops_what_does_not_fit(tokenizer):
    from primus.data.sft import build_sequences, document_ids, tokenize

    examples = [tokenize({"prompt": f"What is {i} plus 1?", "response": f"{i + 1}."}, tokenizer) for i in range(6)]
    examples.append(tokenize({"prompt": "word " * 100, "response": "too long"}, tokenizer))
    lengths = [len(e.tokens) - 1 for e in examples[:6]]
    rows, dropped = build_sequences(examples, seq_len=2 * lengths[0] + 4, pad_id=tokenizer.pad_token_id, packing=True)
    assert dropped == 1
    docs = document_ids(rows[0].positions)
    assert docs[: lengths[0]] == [0] * lengths[0] and docs[lengths[0]] == 1  # a new document restarts at position 0
    assert rows[0].positions[lengths[0]] == 0
    assert sum(len({d for d in document_ids(r.positions)}) for r in rows) >= 6  # every conversation is somewhere


def test_megatron_items_mask_attention_across_documents(tokenizer):
    pytest.importorskip("torch")
    from primus.data.sft import SFTSequences, build_sequences, tokenize
    from primus.backends.megatron.sft_data import MegatronSFTDataset

    examples = [tokenize({"prompt": "Hi", "response": "Yo."}, tokenizer) for _ in range(2)]
    rows, _ = build_sequences(examples, seq_len=32, pad_id=tokenizer.pad_token_id, packing=True)
    item = MegatronSFTDataset(SFTSequences(rows, seed=0), tokenizer.pad_token_id)[0]
    n = len(examples[0].tokens) - 1
    mask = item["attention_mask"][0]  # True = may not attend
    assert not mask[n - 1, 0] and mask[n, 0] and mask[n, n - 1] and not mask[n, n]  # second doc cannot see the first
    assert mask[0, 1]  # causal
    assert item["loss_mask"].sum() == sum(s for e in examples for s in e.supervised[1:])


def test_split_is_deterministic_and_order_is_a_function_of_the_index(instructions, tokenizer):
    from primus.data.sft import SFTDataSpec, build_splits

    spec = SFTDataSpec(path=str(instructions["prompt_response"]), valid_fraction=0.1, seed=3)
    train, valid = build_splits(spec, tokenizer, 64)
    again, _ = build_splits(spec, tokenizer, 64)
    assert valid.conversations == 80 and train.conversations == 720
    assert [again.row(i).inputs for i in (0, 5, 800, 1500)] == [train.row(i).inputs for i in (0, 5, 800, 1500)]
    assert train.row(0).inputs != train.row(len(train)).inputs or train.row(1).inputs != train.row(len(train) + 1).inputs


def test_bad_records_are_one_line_with_file_and_line(tmp_path, tokenizer):
    from primus.data.sft import read_records, tokenize

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "response": "y"}) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        read_records(bad)
    with pytest.raises(ConfigError, match=r"needs `messages`, or `prompt` and `response`"):
        tokenize({"question": "x"}, tokenizer, where="f.jsonl:1")
    with pytest.raises(ConfigError, match="no assistant message"):
        tokenize({"messages": [{"role": "user", "content": "x"}]}, tokenizer)


def test_squad_records_render_as_amd_primus_does_and_learn_the_answer_only(tokenizer):
    """AMD's squad format (Megatron-Bridge's text): "Context: … Question: … Answer: <answer>"."""
    from primus.data.sft import tokenize

    record = {"context": "Paris is in France.", "question": "Where is Paris?",
              "answers": {"text": ["France", "in France"], "answer_start": [12, 9]}}
    example = tokenize(record, tokenizer, "squad")
    assert tokenizer.decode(example.tokens) == (
        "<|begin_of_text|>Context: Paris is in France. Question: Where is Paris? Answer: France<|end_of_text|>")
    assert _supervised_text(tokenizer, example).strip() == "France<|end_of_text|>"
    # the same record without a named format: SQuAD's fields read as prompt and response
    assert _supervised_text(tokenizer, tokenize(record, tokenizer, "plain")) == "France<|end_of_text|>"
    with pytest.raises(ConfigError, match="conversation_format squad needs `context`"):
        tokenize({"prompt": "x", "response": "y"}, tokenizer, "squad", where="f.jsonl:3")


def test_a_hub_dataset_folder_is_read_by_split_from_parquet(tmp_path, tokenizer):
    """A Hub dataset repo as snapshot_download leaves it: Parquet per split under data/; the
    dataset's own validation split is the held-out set, and README/JSON metadata is not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from primus.data.sft import SFTDataSpec, build_splits, read_records

    (tmp_path / "data").mkdir()
    rows = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}."} for i in range(30)]
    pq.write_table(pa.Table.from_pylist(rows[:24]), tmp_path / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[24:]), tmp_path / "data" / "validation-00000-of-00001.parquet")
    (tmp_path / "dataset_infos.json").write_text('{"default": {}}')
    train = read_records(tmp_path)
    assert len(train) == 24 and train[0][0].endswith("train-00000-of-00001.parquet:1")
    assert [r["output"] for _, r in read_records(tmp_path, "valid")] == [f"{i}." for i in range(24, 30)]
    train_seq, valid_seq = build_splits(SFTDataSpec(path=str(tmp_path), conversation_format="alpaca"), tokenizer, 256)
    assert (train_seq.conversations, valid_seq.conversations) == (24, 6)
    with pytest.raises(ConfigError, match="no such instruction file"):
        read_records(tmp_path / "absent")
