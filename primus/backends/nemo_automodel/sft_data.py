"""Instruction data as a NeMo AutoModel dataset config (its typed ``build(tokenizer=...)`` contract).

``dataset: {_target_: primus.backends.nemo_automodel.sft_data.SFTDatasetConfig, path: ...}`` in an AutoModel LLM
section gives the recipe the same conversations, rendering and response-only labels as the
Megatron and TorchTitan backends (``primus.data.sft``), in AutoModel's shifted next-token layout
(``input_ids``, ``labels`` with -100, ``attention_mask``). One conversation per item: AutoModel's
``default_collater`` pads each micro-batch to its longest item; its own ``packed_sequence``
settings apply on top when set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from primus.data.sft import IGNORE_INDEX, Format, SFTDataSpec, build_splits, document_ids, load_tokenizer, loss_targets


class SFTExamples:
    """Map-style: one conversation per index (AutoModel's sampler shuffles and shards)."""

    def __init__(self, rows, pad_id: int):
        self.rows, self.pad_id = rows, pad_id

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        n = document_ids(row.positions).count(0)  # the conversation; the rest is padding
        return {"input_ids": row.inputs[:n], "labels": loss_targets(row)[0][:n], "attention_mask": [1] * n,
                "___PAD_TOKEN_IDS___": {"input_ids": self.pad_id, "labels": IGNORE_INDEX, "attention_mask": 0}}


@dataclass
class SFTDatasetConfig:
    """Typed dataset config for AutoModel's ``DataloaderConfig`` (fields are the YAML keys)."""

    path: str
    tokenizer_path: str
    split: Literal["train", "valid"] = "train"
    valid_path: str | None = None
    valid_fraction: float = 0.05
    conversation_format: Format = "auto"
    seq_length: int = 2048
    seed: int = 1234
    accepts_tokenizer: ClassVar[bool] = True

    def build(self, *, tokenizer=None) -> SFTExamples:
        """The split's conversations. The tokenizer is read from ``tokenizer_path`` (the HF one every
        backend uses) rather than AutoModel's wrapper, which may add BOS/EOS on its own."""
        import logging

        from primus.data.sft import describe

        hf_tokenizer = load_tokenizer(self.tokenizer_path)
        spec = SFTDataSpec(path=self.path, valid_path=self.valid_path, valid_fraction=self.valid_fraction,
                           conversation_format=self.conversation_format, packing=False, seed=self.seed)
        train, valid = build_splits(spec, hf_tokenizer, self.seq_length)
        data = train if self.split == "train" else valid
        if data is None:
            raise ValueError("SFT validation needs held-out data: set valid_fraction > 0 or valid_path")
        logging.getLogger("primus.sft").info(describe(self.split, data, packing=False))
        pad = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else hf_tokenizer.eos_token_id
        return SFTExamples(data.rows, pad)
