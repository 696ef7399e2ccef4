"""Instruction data in the batch layout megatron-core's GPT forward step reads.

Each item is what ``GPTDataset`` yields (``tokens``, ``labels``, ``loss_mask``, ``position_ids``,
``attention_mask``), so the Megatron trainer's data path, loss (token-summed over ``loss_mask``)
and evaluation work unchanged. Packed documents are isolated with a block-diagonal causal mask
(``True`` = masked, Megatron's convention), which the local and Transformer Engine attention
both honour; position ids restart at every document.
"""
from __future__ import annotations

from primus.data.sft import SFTSequences, document_ids, loss_targets


class MegatronSFTDataset:
    """Map-style: index i -> the i-th row of the deterministic epoch order (cyclic, like Megatron's sampler)."""

    def __init__(self, sequences: SFTSequences, pad_id: int):
        self.sequences, self.pad_id = sequences, pad_id

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict:
        import torch

        row = self.sequences.row(index)
        targets, carries_loss = loss_targets(row, fill=self.pad_id)
        docs = torch.tensor(document_ids(row.positions))
        n = len(row)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
        same_document = docs.unsqueeze(0) == docs.unsqueeze(1)
        return {
            "tokens": torch.tensor(row.inputs, dtype=torch.long),
            "labels": torch.tensor(targets, dtype=torch.long),
            "loss_mask": torch.tensor(carries_loss, dtype=torch.float),
            "position_ids": torch.tensor(row.positions, dtype=torch.long),
            "attention_mask": ~(causal & same_document).unsqueeze(0),
        }
