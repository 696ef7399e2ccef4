"""Data for the Megatron backend: megatron-core's GPTDataset / MockGPTDataset built by
BlendedMegatronDatasetBuilder, read in Megatron-LM's pretraining-sampler order.

The order is a pure function of ``consumed_samples``, so resuming from a checkpoint at
iteration k continues with exactly the batches an uninterrupted run would have seen.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from primus.backends.megatron.arguments import MegatronArgs
from primus.config.errors import ConfigError


def _as_list(paths) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths or [])


def blend(data_path) -> tuple[list[str], list[float] | None]:
    """Megatron-LM's ``--data-path`` form: ``[prefix ...]`` or ``[weight prefix weight prefix ...]``."""
    data_path = _as_list(data_path)
    try:
        weights = [float(x) for x in data_path[0::2]]
    except ValueError:
        return list(data_path), None
    if len(data_path) % 2:
        raise ConfigError(f"data_path: weights and prefixes must alternate (got {data_path})")
    return list(data_path[1::2]), weights


def blend_prefixes(data_path) -> list[str]:
    return blend(data_path)[0] if data_path else []


DATA_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def data_prefixes(params: dict) -> list[tuple[str, str]]:
    """(key, prefix) of every indexed dataset the arguments name (before validation: plain data)."""
    if params.get("mock_data"):
        return []
    return [(key, prefix) for key in DATA_KEYS for prefix in blend_prefixes(params.get(key))]


def _dataset_blends(args: MegatronArgs):
    """(blend, blend_per_split) as Megatron-LM's ``get_blend_and_blend_per_split``."""
    from megatron.core.datasets.utils import get_blend_from_list

    if args.mock_data:
        return None, None
    for key, prefix in data_prefixes({key: getattr(args, key) for key in (*DATA_KEYS, "mock_data")}):
        if not Path(prefix + ".bin").exists() or not Path(prefix + ".idx").exists():
            raise ConfigError(f"{key}: {prefix}.bin/.idx not found (build them with `primus data build-indexed`)")
    if args.data_path:
        return get_blend_from_list(_as_list(args.data_path)), None
    per_split = [get_blend_from_list(_as_list(p)) if p else None
                 for p in (args.train_data_path, args.valid_data_path, args.test_data_path)]
    return None, per_split


def build_datasets(args: MegatronArgs, tokenizer, global_batch_size: int, dp_size: int):
    """(train, valid, test) datasets with enough samples for ``train_iters`` and evaluation, from
    ``data_path`` + ``split`` or from ``train/valid/test_data_path`` (one blend per split)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    data_blend, blend_per_split = _dataset_blends(args)
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=data_blend,
        blend_per_split=blend_per_split,
        split=args.split if data_blend else None,
        path_to_cache=args.data_cache_path,
        mmap_bin_files=args.mmap_bin_files,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        tokenizer=tokenizer,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        data_parallel_size=dp_size,
    )
    evaluations = (args.train_iters // args.eval_interval + 1) if args.eval_interval else 0
    sizes = [
        args.train_iters * global_batch_size,
        evaluations * args.eval_iters * global_batch_size,
        args.eval_iters * global_batch_size if evaluations else 0,
    ]
    cls = MockGPTDataset if args.mock_data else GPTDataset
    return BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()


def blend_summary(dataset, split: str, samples: int | None = None) -> str | None:
    """The log line of a blended split (megatron-core's ``BlendedDataset``): each dataset's weight and how
    many of the split's first ``samples`` (all: None) it gives (its ``dataset_index``: the order the run
    reads); None for a single dataset. megatron-core sizes a blend at the sum of each dataset's rounded-up
    share, a sample or two over what the run asks for."""
    import numpy

    from primus.data.blend import describe_blend

    if dataset is None or not hasattr(dataset, "dataset_index"):
        return None
    drawn = dataset.dataset_index[:len(dataset) if samples is None else min(samples, len(dataset))]
    counts = numpy.bincount(drawn, minlength=len(dataset.datasets)).tolist()
    weights = dataset.weights or [1 / len(dataset.datasets)] * len(dataset.datasets)  # None: exhaustive
    return describe_blend(split, [d.dataset_path for d in dataset.datasets], weights, counts)


def micro_batches(dataset, *, consumed_samples: int, global_batch_size: int, micro_batch_size: int,
                  dp_rank: int, dp_size: int, device: str = "cpu", cyclic: bool = False, data_sharding: bool = True):
    """This rank's micro-batches for one global batch, on ``device`` (Megatron-LM's ``get_batch`` moves
    them with ``.cuda(non_blocking=True)``), in the order of Megatron-LM's sampler:

    - ``dataloader_type: single`` (MegatronPretrainingSampler): global batch i covers samples
      [i*G, (i+1)*G); micro-batch j of DP rank d reads the ``micro_batch_size`` samples at
      ``consumed + j*mbs*dp + d*mbs``;
    - ``cyclic`` (MegatronPretrainingRandomSampler, re-iterated each epoch): ``cyclic_indices``.
    """
    from torch.utils.data import default_collate

    step = micro_batch_size * dp_size
    out = []
    for start in range(consumed_samples, consumed_samples + global_batch_size, step):
        if cyclic:
            indices = cyclic_indices(start, total=len(dataset), micro_batch_size=micro_batch_size, dp_rank=dp_rank,
                                     dp_size=dp_size, data_sharding=data_sharding)
        else:
            first = start + dp_rank * micro_batch_size
            indices = [(first + k) % len(dataset) for k in range(micro_batch_size)]
        batch = default_collate([dataset[i] for i in indices])  # Megatron-LM's DataLoader collates so (a blend's
        out.append({key: value.to(device, non_blocking=True) for key, value in batch.items()})  # numpy dataset_id too)
    return out


def sample_positions(*, consumed_samples: int, global_batch_size: int, micro_batch_size: int, dp_rank: int,
                     dp_size: int) -> list[list[int]]:
    """Where this rank's micro-batch rows stand in the run's stream of samples (``micro_batches``'
    order): in the sequential order the same positions hold the same samples whatever the
    data-parallel size (primus.sample_hashes keys them so)."""
    step = micro_batch_size * dp_size
    return [[start + dp_rank * micro_batch_size + k for k in range(micro_batch_size)]
            for start in range(consumed_samples, consumed_samples + global_batch_size, step)]


def cyclic_indices(position: int, *, total: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                   data_sharding: bool = True) -> list[int]:
    """The micro-batch DP rank ``dp_rank`` reads once ``position`` samples are consumed (a multiple of
    ``micro_batch_size * dp_size``), as Megatron-LM's MegatronPretrainingRandomSampler yields it
    (megatron/training/datasets/data_samplers.py, d3528a2): epoch e = position // active samples
    reshuffles with ``torch.randperm(seed=e)``; with ``data_sharding`` each rank draws from its own
    contiguous bucket, without it every rank strides one permutation of the whole dataset. As a pure
    function of ``position``, a resumed run continues the same stream. (Without data sharding and with
    ``total % (mbs*dp) >= mbs``, Megatron-LM's ranks draw unequal counts at an epoch's end; here every
    epoch ends at the active samples.)"""
    per_step = micro_batch_size * dp_size
    active = total - total % per_step
    if active <= 0:
        raise ConfigError(f"dataloader_type: cyclic needs at least micro_batch_size x data-parallel size "
                          f"({per_step}) samples, the dataset has {total}")
    epoch, offset = divmod(position, active)
    if data_sharding:
        bucket = (total // per_step) * micro_batch_size
        start = offset // dp_size
        return [dp_rank * bucket + i for i in _permutation(epoch, bucket)[start:start + micro_batch_size]]
    permutation = _permutation(epoch, (total // micro_batch_size) * micro_batch_size)
    return [permutation[offset + dp_rank + i * dp_size] for i in range(micro_batch_size)]


@lru_cache(maxsize=2)
def _permutation(epoch: int, size: int) -> list[int]:
    import torch

    generator = torch.Generator()
    generator.manual_seed(epoch)
    return torch.randperm(size, generator=generator).tolist()
