"""Data for the Megatron backend: megatron-core's GPTDataset / MockGPTDataset built by
BlendedMegatronDatasetBuilder, read in Megatron-LM's pretraining-sampler order.

The order is a pure function of ``consumed_samples``, so resuming from a checkpoint at
iteration k continues with exactly the batches an uninterrupted run would have seen.
"""
from __future__ import annotations

import json
from pathlib import Path

from primus.backends.megatron.arguments import MegatronArgs
from primus.config.errors import ConfigError


class HFTokenizer:
    """The slice of Megatron's tokenizer interface GPTDataset uses, over a HF ``tokenizer.json``."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        directory = Path(path) if Path(path).is_dir() else Path(path).parent
        file = directory / "tokenizer.json" if Path(path).is_dir() else Path(path)
        if not file.exists():
            raise ConfigError(f"tokenizer_model: no tokenizer.json at {file}")
        self._tokenizer = Tokenizer.from_file(str(file))
        self.vocab_size = self._tokenizer.get_vocab_size()
        eos = None
        config = directory / "tokenizer_config.json"
        if config.exists():
            eos = json.loads(config.read_text()).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
        eod = self._tokenizer.token_to_id(eos) if eos else None
        self.eod = eod if eod is not None else self.vocab_size - 1
        # GPTDataset hashes this into its index-cache file names (as MegatronLegacyTokenizer does).
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer_path": [str(file)]}

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids


class NullTokenizer:
    """Megatron-LM's NullTokenizer: no text, only a vocabulary size (mock data); EOD is the last id."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.unique_identifiers = {"class": type(self).__name__, "vocab_size": vocab_size}


def build_tokenizer(args: MegatronArgs):
    if args.tokenizer_type == "HuggingFaceTokenizer":
        return HFTokenizer(args.tokenizer_model)
    if args.vocab_size is None:
        raise ConfigError("vocab_size: required with tokenizer_type: NullTokenizer / mock_data (or give a model: preset)")
    return NullTokenizer(args.vocab_size)


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


def micro_batches(dataset, *, consumed_samples: int, global_batch_size: int, micro_batch_size: int,
                  dp_rank: int, dp_size: int, device: str = "cpu"):
    """This rank's micro-batches for one global batch, in Megatron-LM's MegatronPretrainingSampler order,
    on ``device`` (Megatron-LM's ``get_batch`` moves them with ``.cuda(non_blocking=True)``).

    Global batch i covers samples [i*G, (i+1)*G); micro-batch j of DP rank d reads the
    ``micro_batch_size`` samples at ``consumed + j*mbs*dp + d*mbs``.
    """
    import torch

    out = []
    for indices in sample_indices(consumed_samples=consumed_samples, global_batch_size=global_batch_size,
                                  micro_batch_size=micro_batch_size, dp_rank=dp_rank, dp_size=dp_size):
        samples = [dataset[index % len(dataset)] for index in indices]
        out.append({key: torch.stack([s[key] for s in samples]).to(device, non_blocking=True) for key in samples[0]})
    return out


def sample_indices(*, consumed_samples: int, global_batch_size: int, micro_batch_size: int, dp_rank: int,
                   dp_size: int) -> list[list[int]]:
    """The global sample indices of this rank's micro-batches (``micro_batches``' order): the same
    samples make the same global batch whatever the data-parallel size."""
    step = micro_batch_size * dp_size
    return [[start + dp_rank * micro_batch_size + k for k in range(micro_batch_size)]
            for start in range(consumed_samples, consumed_samples + global_batch_size, step)]
