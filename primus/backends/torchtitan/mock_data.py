"""``dataloader.dataset: mock``: AMD Primus's TorchTitan mock data, as a TorchTitan dataset.

AMD Primus (fd1eeab, ``primus/backends/torchtitan/patches/mock_dataset_patches.py``) answers
``training.mock_data: true`` by replacing ``datasets.load_dataset`` with 256 samples of 8,192 random
integers in [0, 32000) written as space-separated text (numpy seed 42), which the run's own tokenizer
then tokenizes. The same samples are registered here under TorchTitan's extension point (its
``DATASETS`` table) instead of patching ``datasets``: throughput runs with no data to download.
"""
from __future__ import annotations

MOCK = "mock"
SAMPLES, INTEGERS, VOCAB, SEED = 256, 8192, 32000, 42  # AMD Primus's values


def mock_texts(samples: int = SAMPLES, integers: int = INTEGERS) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    return [" ".join(map(str, rng.integers(0, VOCAB, size=integers, dtype=np.int32))) for _ in range(samples)]


def _load(_path: str):
    from datasets import Dataset

    return Dataset.from_dict({"text": mock_texts()})


def register(datasets: dict) -> None:
    from torchtitan.hf_datasets import DatasetConfig

    datasets.setdefault(MOCK, DatasetConfig(path="", loader=_load, sample_processor=lambda sample: sample["text"]))
