"""Shared fixtures: one tiny random Wan 2.2 pipeline + latent cache per test session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("nemo_automodel", reason="the automodel stack is installed by `primus prepare automodel`")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    import logging

    from primus.backends.nemo_automodel.adapter import ensure_tiny_assets

    root = tmp_path_factory.mktemp("wan2_2_tiny")
    ensure_tiny_assets(root, logging.getLogger("primus.test"))  # what a fresh `primus train` does
    assert (root / ".complete").exists() and (root / "cache" / "metadata.json").exists()
    return root


@pytest.fixture
def tiny_params(tiny_root):
    """(stage, params) of the tiny CPU example pointed at the session's assets, 2 steps by default."""
    from automodel_harness import load_example

    def make(**overrides):
        base = {"tiny_assets": str(tiny_root),
                "model": {"pretrained_model_name_or_path": str(tiny_root / "pipeline")},
                "data": {"dataloader": {"cache_dir": str(tiny_root / "cache")}},
                "step_scheduler": {"max_steps": 2, "ckpt_every_steps": 2}}
        from automodel_harness import deep_merge

        return load_example(EXAMPLE, **deep_merge(base, overrides))

    return make
