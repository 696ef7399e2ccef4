"""Tiny random Hugging Face models built locally from a transformers config (no hub), one per family."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """``hf_models(family) -> Path``: a tiny ``family`` checkpoint + chat tokenizer, built once per session."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf_models")
    built = {}

    def get(family: str = "llama"):
        if family not in built:
            from primus.hf.tiny import build_tiny_hf_model

            built[family] = build_tiny_hf_model(root / family, family, seed=7)
        return built[family]

    return get


@pytest.fixture(scope="session")
def instructions(tmp_path_factory):
    from primus.data.sft_tiny import write_instruction_files

    return write_instruction_files(tmp_path_factory.mktemp("instructions"))
