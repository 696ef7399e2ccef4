"""TorchTitan's text dataloader: a data order that does not depend on the data-parallel degree, and
weighted blends of datasets.

TorchTitan 0.3.0 gives each data-parallel rank its own share of the documents
(``split_dataset_by_node``) and packs them on that rank, so what a step trains on depends on the
degree, each rank checkpoints its own position (``dp_rank_<r>``), and a checkpoint written at
another degree is refused ("dataloader resharding is not supported yet").

``dataloader.reshardable: true`` packs the whole document stream into sequences, in one order, on
every rank, and gives rank r the sequences r, r + dp, r + 2 dp, ...: a step of global batch G
trains on sequences [s·G, (s+1)·G) whatever the degree. Each rank reads whole rounds of dp
sequences, so at a step boundary every rank's stream stands at the same place and the checkpoint
holds one data position for all of them (``ALL_RANKS``): a run resumes at another data-parallel
degree where it stopped. The price is that every rank reads and tokenizes every document; meant
for corpora that tokenize much faster than the model trains on them (local JSONL/text here).

``dataloader.blend: [0.2, path_a, 0.3, path_b, 0.5, path_c]`` (Megatron's form; each path read as
``dataloader.dataset``) packs each dataset into sequences on its own and draws them in megatron-core's
blending order (``primus.data.blend``): any prefix of a rank's sequences holds each dataset's share
to within one sequence. Each dataset's position rides in the checkpoint.
"""
from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader, HuggingFaceTextDataset

from primus.data.blend import next_source, parse_blend

ALL_RANKS = "all_ranks"  # the key of the one data position a reshardable loader checkpoints
PER_RANK_PREFIX = "dp_rank_"  # TorchTitan's own: one position per data-parallel rank


class ReshardableTextDataset(HuggingFaceTextDataset):
    """TorchTitan's packed text stream, read whole on every rank; this rank keeps every dp-th sequence."""

    def __init__(self, *, dp_rank: int, dp_world_size: int, **kwargs: Any) -> None:
        super().__init__(dp_rank=0, dp_world_size=1, **kwargs)
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size

    def __iter__(self):
        stream = super().__iter__()
        while True:
            round_ = list(itertools.islice(stream, self.dp_world_size))  # the stream's state: after the round
            if len(round_) < self.dp_world_size:
                return  # a finite dataset ran out mid-round
            yield round_[self.dp_rank]


class BlendedTextDataset(IterableDataset, Stateful):
    """Several of TorchTitan's packed text streams, each sequence taken from the one that lags its weight most."""

    def __init__(self, *, paths: list[str], weights: list[float], **kwargs: Any) -> None:
        self.sources = [HuggingFaceTextDataset(dataset_path=path, **kwargs) for path in paths]
        self.weights = weights
        self.counts = [0] * len(paths)  # sequences each source has given

    def __iter__(self):
        streams = [iter(source) for source in self.sources]
        while True:
            source = next_source(self.weights, self.counts)
            item = next(streams[source], None)
            if item is None:
                return  # a finite dataset ran out
            self.counts[source] += 1
            yield item

    def state_dict(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sources": [source.state_dict() for source in self.sources]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts = list(state_dict["counts"])
        for source, state in zip(self.sources, state_dict["sources"]):
            source.load_state_dict(state)


class PrimusTextDataLoader(HuggingFaceTextDataLoader):
    """TorchTitan's ``HuggingFaceTextDataLoader``; with ``reshardable`` the order above and one data position."""

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        reshardable: bool = False
        """One data order and position for every data-parallel degree, so a checkpoint resumes at another
        degree (every rank tokenizes every document)."""
        blend: list[float | str] = field(default_factory=list)
        """A weighted blend instead of ``dataset_path``: ``[weight, path, weight, path, ...]`` (Megatron's
        ``data_path`` form), each path read as ``dataset``."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs: Any) -> None:
        self.reshardable = config.reshardable
        if config.blend:
            paths, weights = parse_blend(config.blend)
            dataset = BlendedTextDataset(paths=paths, weights=weights, dataset_name=config.dataset, tokenizer=tokenizer,
                                         seq_len=seq_len, infinite=config.infinite, dp_rank=dp_rank,
                                         dp_world_size=dp_world_size)
        elif not self.reshardable:
            super().__init__(config, dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=tokenizer, seq_len=seq_len,
                             local_batch_size=local_batch_size, snapshot_every_n_steps=snapshot_every_n_steps, **kwargs)
            return
        else:
            dataset = ReshardableTextDataset(dataset_name=config.dataset, dataset_path=config.dataset_path,
                                             tokenizer=tokenizer, seq_len=seq_len, infinite=config.infinite,
                                             dp_rank=dp_rank, dp_world_size=dp_world_size)
        ParallelAwareDataloader.__init__(self, dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                         num_workers=config.num_workers, persistent_workers=config.persistent_workers,
                                         pin_memory=config.pin_memory, prefetch_factor=config.prefetch_factor,
                                         snapshot_every_n_steps=snapshot_every_n_steps, batch_size=local_batch_size)

    def state_dict(self) -> dict[str, Any]:
        if not self.reshardable:
            return super().state_dict()
        return {ALL_RANKS: pickle.dumps(StatefulDataLoader.state_dict(self))}  # equal on every rank

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.reshardable or not state_dict:
            return super().load_state_dict(state_dict)
        StatefulDataLoader.load_state_dict(self, pickle.loads(state_dict[ALL_RANKS]))


def blend_problem(config: Any) -> str | None:
    """What is wrong with ``dataloader.blend`` (its form, or with ``reshardable``), or None."""
    if not getattr(config, "blend", None):
        return None
    try:
        parse_blend(config.blend)
    except ValueError as exc:
        return str(exc)
    if config.reshardable:
        return "a blend draws per rank; it does not combine with dataloader.reshardable"
    return None


def blend_summary(config: Any, sequences_per_rank: int, ranks: int) -> str | None:
    """The log line of a blended run: each dataset's weight and the sequences it gives over the run
    (every data-parallel rank draws the same counts from its own share)."""
    from primus.data.blend import describe_blend, draw_counts

    if not getattr(config, "blend", None):
        return None
    paths, weights = parse_blend(config.blend)
    counts = [ranks * n for n in draw_counts(weights, sequences_per_rank)]
    return describe_blend("train", paths, weights, counts)


def dealt_over(dataloader: Any) -> int | None:
    """The degree a reshardable loader deals its one order over (rank r holds sequences r, r + dp, ...),
    so ``primus.sample_hashes`` keys each sequence by its place in the global batch; else None."""
    return dataloader.dp_world_size if getattr(dataloader, "reshardable", False) else None


def data_parallel_degree(parallelism: Any, world_size: int) -> int:
    """TorchTitan's ``batch`` mesh: dp_replicate x dp_shard (-1 fills the world)."""
    replicate, shard = parallelism.data_parallel_replicate_degree, parallelism.data_parallel_shard_degree
    if shard < 0:
        others = replicate * parallelism.tensor_parallel_degree * parallelism.pipeline_parallel_degree * \
            parallelism.context_parallel_degree
        shard = world_size // others
    return replicate * shard


def dataloader_problem(checkpoint: Path, cfg: Any, world_size: int) -> str | None:
    """Why the dataloader state in ``checkpoint`` (a ``step-N`` DCP directory) cannot be loaded by the run
    ``cfg`` on ``world_size`` ranks, or None."""
    from torch.distributed.checkpoint import FileSystemReader

    if "dataloader" in cfg.checkpoint.exclude_from_loading:
        return None
    try:
        keys = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001 - verified before resuming; nothing to add here
        return None
    per_rank = {key for key in keys if key.startswith(f"dataloader.{PER_RANK_PREFIX}")}
    shared = f"dataloader.{ALL_RANKS}" in keys
    degree = data_parallel_degree(cfg.parallelism, world_size)
    reshardable = getattr(cfg.dataloader, "reshardable", False)
    exclude = "checkpoint.exclude_from_loading: [dataloader] restarts the data from its beginning instead"
    hint = "; dataloader.reshardable: true writes checkpoints that resume at any degree" \
        if hasattr(cfg.dataloader, "reshardable") else ""
    if shared and not reshardable:
        return (f"{checkpoint} holds the data position of dataloader.reshardable: true, which this run does not set; "
                f"set it again to resume (or {exclude})")
    if per_rank and reshardable:
        return (f"{checkpoint} holds TorchTitan's per-rank data positions (written without dataloader.reshardable), "
                f"which a reshardable loader cannot read; set dataloader.reshardable: false to resume (or {exclude})")
    if per_rank and len(per_rank) != degree:
        return (f"{checkpoint} was written at data-parallel degree {len(per_rank)}, this run's is {degree}: TorchTitan "
                f"0.3.0 keeps one data position per data-parallel rank and cannot reshard them (\"dataloader resharding "
                f"is not supported yet\"); resume at degree {len(per_rank)}, or {exclude}{hint}")
    return None
