"""Instruction data as a TorchTitan dataloader: a ``Configurable`` its ``Trainer`` builds itself.

Set as ``Trainer.Config.dataloader`` (and as the validator's dataloader with ``split: valid``) for
``stage: sft``; the section's keys are this ``Config``'s fields, so unknown keys are refused like
any other TorchTitan key. Batches are ``({"input", "positions"}, labels)`` with ``IGNORE_INDEX``
(TorchTitan's own) on everything but response tokens; the trainer counts valid tokens and
normalises the loss by them. Packed documents restart their positions at 0, which TorchTitan's
FlexAttention / varlen masks turn into per-document attention; on CPU (causal SDPA) the SFT recipe
gives SDPA the same boundaries as an explicit mask (``attention.DocumentCausalSDPA``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader

from primus.config.errors import ConfigError
from primus.data.sft import Format, SFTDataSpec, SFTSequences, build_splits, describe, load_tokenizer, loss_targets


class SFTIterable(IterableDataset, Stateful):
    """This DP rank's rows (every ``dp_world``-th of the deterministic order); resumable by index."""

    def __init__(self, sequences: SFTSequences, dp_rank: int, dp_world: int, infinite: bool):
        self.sequences, self.dp_rank, self.dp_world, self.infinite = sequences, dp_rank, dp_world, infinite
        self.index = dp_rank

    def __iter__(self):
        while self.infinite or self.index < len(self.sequences):
            row = self.sequences.row(self.index)
            self.index += self.dp_world
            yield ({"input": torch.tensor(row.inputs), "positions": torch.tensor(row.positions)},
                   torch.tensor(loss_targets(row)[0]))

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.index = state_dict["index"]


@functools.lru_cache(maxsize=4)
def _splits(spec: SFTDataSpec, tokenizer_path: str, seq_len: int):
    """Tokenized (and said) once per process: TorchTitan's validator builds its dataloader at every evaluation."""
    import logging

    train, valid = build_splits(spec, load_tokenizer(tokenizer_path), seq_len)
    for name, data in (("train", train), ("valid", valid)):
        if data is not None:
            logging.getLogger("primus.sft").info(describe(name, data, spec.packing))
    return train, valid


class SFTDataLoader(ParallelAwareDataloader):
    """Primus instruction data (``primus.data.sft``) for TorchTitan's trainer and validator."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        # dataset_path (inherited): the instruction JSONL file, or a folder of *.jsonl files
        valid_dataset_path: str | None = None
        """Validation JSONL; default: ``valid_fraction`` of ``dataset_path`` held out."""

        valid_fraction: float = 0.05
        conversation_format: Format = "auto"
        packing: bool = False
        """Several conversations per sequence, each attending only to itself (flex, varlen, or SDPA with a
        per-document mask)."""

        seed: int = 1234
        split: Literal["train", "valid"] = "train"
        infinite: bool = True

        def spec(self) -> SFTDataSpec:
            return SFTDataSpec(path=self.dataset_path, valid_path=self.valid_dataset_path,
                               valid_fraction=self.valid_fraction, conversation_format=self.conversation_format,
                               packing=self.packing, seed=self.seed)

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        train, valid = _splits(config.spec(), getattr(tokenizer, "tokenizer_path"), seq_len)
        sequences = train if config.split == "train" else valid
        if sequences is None:
            raise ConfigError("SFT validation needs held-out data: set dataloader.valid_fraction > 0 or "
                             "dataloader.valid_dataset_path")
        super().__init__(SFTIterable(sequences, dp_rank, dp_world_size, config.infinite), dp_rank=dp_rank,
                         dp_world_size=dp_world_size, num_workers=config.num_workers,
                         persistent_workers=config.persistent_workers, pin_memory=config.pin_memory,
                         prefetch_factor=config.prefetch_factor, snapshot_every_n_steps=snapshot_every_n_steps,
                         batch_size=local_batch_size)
