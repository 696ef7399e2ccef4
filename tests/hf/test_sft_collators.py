"""The three backends' SFT batches take loss on the same tokens: ``primus.data.sft.loss_targets``.

One multi-turn conversation through Megatron's dataset (``loss_mask`` + labels), TorchTitan's
iterable (labels with -100) and AutoModel's dataset through AutoModel's own ``default_collater``
(labels with -100, padded): each backend's loss-carrying (position, target) pairs are identical,
and they are the assistant turns' tokens (with their end-of-turn markers and the final EOS) only.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

CONVERSATION = {"messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Goodbye."}]}


@pytest.fixture(scope="module")
def tokenizer(hf_models):
    from primus.data.sft import load_tokenizer

    return load_tokenizer(hf_models("llama"))


@pytest.fixture(scope="module")
def sequences(tokenizer):
    from primus.data.sft import SFTSequences, build_sequences, tokenize

    example = tokenize(CONVERSATION, tokenizer)
    rows, _ = build_sequences([example], len(example.tokens) + 6, tokenizer.pad_token_id, packing=False)
    return SFTSequences(rows, seed=0, conversations=1)


def _pairs(targets, carries_loss) -> list[tuple[int, int]]:
    return [(i, int(t)) for i, (t, loss) in enumerate(zip(targets, carries_loss)) if loss]


def megatron_pairs(sequences, pad_id):
    from primus.backends.megatron.sft_data import MegatronSFTDataset

    item = MegatronSFTDataset(sequences, pad_id)[0]
    assert set(item["labels"][item["loss_mask"] == 0].tolist()) <= {pad_id}  # real ids where no loss is taken
    return _pairs(item["labels"].tolist(), item["loss_mask"].bool().tolist()), item["tokens"].tolist()


def torchtitan_pairs(sequences):
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()  # before TorchTitan's first import
    from primus.backends.torchtitan.sft_data import SFTIterable

    inputs, labels = next(iter(SFTIterable(sequences, dp_rank=0, dp_world=1, infinite=False)))
    return _pairs(labels.tolist(), (labels != -100).tolist()), inputs["input"].tolist()


def automodel_pairs(sequences, pad_id):
    pytest.importorskip("nemo_automodel")
    from nemo_automodel.components.datasets.utils import default_collater

    from primus.backends.nemo_automodel.sft_data import SFTExamples

    batch = default_collater([SFTExamples(sequences.rows, pad_id)[0]])
    labels = batch["labels"][0]
    return _pairs(labels.tolist(), (labels != -100).tolist()), batch["input_ids"][0].tolist()


def test_megatron_torchtitan_and_automodel_take_loss_on_the_same_tokens(sequences, tokenizer):
    pad = tokenizer.pad_token_id
    megatron, megatron_inputs = megatron_pairs(sequences, pad)
    titan, titan_inputs = torchtitan_pairs(sequences)
    automodel, automodel_inputs = automodel_pairs(sequences, pad)
    assert megatron == titan == automodel
    conversation = len(automodel_inputs)  # AutoModel keeps the conversation without the row's padding
    assert megatron_inputs == titan_inputs and megatron_inputs[:conversation] == automodel_inputs
    assert len(megatron) == sequences.supervised_tokens()
    # what the definition is: the assistant turns (and the end of sequence), never the system or user turns
    assert tokenizer.decode([target for _, target in megatron]) == "Hello.<|end|>Goodbye.<|end|><|end_of_text|>"


def test_loss_targets_fills_where_no_loss_is_taken(sequences):
    from primus.data.sft import IGNORE_INDEX, loss_targets

    row = sequences.rows[0]
    ignored, carries = loss_targets(row)
    filled, same = loss_targets(row, fill=7)
    assert carries == same and 0 < sum(carries) < len(row)
    assert {t for t, loss in zip(ignored, carries) if not loss} == {IGNORE_INDEX}
    assert {t for t, loss in zip(filled, carries) if not loss} == {7}
    assert [t for t, loss in zip(filled, carries) if loss] == [t for t, loss in zip(ignored, carries) if loss]
