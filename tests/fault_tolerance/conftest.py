"""Finished tiny runs that several fault tests start from (each test works on a copy)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_EXAMPLE
from tests.helpers import train_in_workspace

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
TRAINED = "tiny"  # the exp_name of the runs below


@pytest.fixture(scope="session")
def titan_trained(tmp_path_factory, tiny_cache) -> Path:
    """A workspace holding a completed 2-step TorchTitan run with checkpoints step-1 and step-2."""
    pytest.importorskip("torchtitan")
    return train_in_workspace(tmp_path_factory.mktemp("titan-trained"), tiny_cache, TINY_EXAMPLE, TRAINED,
                              "training.steps=2", "checkpoint.interval=1")


@pytest.fixture(scope="session")
def megatron_trained(tmp_path_factory, tiny_cache) -> Path:
    """A workspace holding a completed 4-iteration Megatron run with checkpoints iter 2 and 4."""
    pytest.importorskip("megatron.core")
    return train_in_workspace(tmp_path_factory.mktemp("megatron-trained"), tiny_cache, MEGATRON, TRAINED,
                              "train_iters=4", "save_interval=2", "eval_interval=100")
