"""Tiny random Hugging Face models built locally from a transformers config (no hub), one per family."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """``hf_models(family) -> Path``: a tiny ``family`` checkpoint + chat tokenizer, built once per session."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf_models")
    built = {}

    def get(family: str = "llama", **shape):
        key = family + "".join(f"-{k}={v}" for k, v in sorted(shape.items()))
        if key not in built:
            from primus.hf.tiny import build_tiny_hf_model

            built[key] = build_tiny_hf_model(root / key, family, seed=7, **shape)
        return built[key]

    return get


@pytest.fixture(scope="session")
def instructions(tmp_path_factory):
    from primus.data.sft_tiny import write_instruction_files

    return write_instruction_files(tmp_path_factory.mktemp("instructions"))
