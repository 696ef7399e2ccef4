"""A module section -> the Megatron-LM arguments in it (what ``parse_args`` reads).

The ``primus:`` and ``lora:`` blocks and the post-training keys (``hf_path``, ``sft_*``) are Primus's
own and are taken out; what ``hf_path`` implies (the network from its config.json, its tokenizer)
and what ``primus.tiny_assets`` points at (the tiny tokenizer and ``.bin/.idx`` corpus) are put in.
Pure: the tiny files are described here and built by the recipe's ``prepare``.
"""
from __future__ import annotations

from typing import Any

from primus.backends.megatron.post_training import is_post_training, strip_post_training
from primus.data.tiny_assets import tiny_assets_dir

TINY_PREFIX = "megatron/tiny_text_document"  # under primus.tiny_assets


def megatron_params(params: dict[str, Any], derived: list[tuple[str, Any, str]] | None = None, *,
                    prefix: str = "modules.pre_trainer", provenance=None) -> dict[str, Any]:
    """The Megatron arguments in ``params``; each value Primus sets is appended to ``derived``.

    A run from HF weights / on instructions names its files itself: ``primus.tiny_assets`` only builds
    them (``prepare``), it never overrides them."""
    params = dict(params)
    extra = params.pop("primus", None) or {}  # checked against primus.config.schema.PrimusOptions
    params.pop("lora", None)  # Primus's LoRA block (primus/backends/megatron/lora.py), not a Megatron-LM argument
    root = tiny_assets_dir({"primus": extra})
    names_its_files = is_post_training(params)
    params = strip_post_training(params, derived, prefix=prefix, provenance=provenance, tiny_root=root)
    if root is not None and not names_its_files:
        params.update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(root / "tokenizer"),
                      data_path=[str(root / TINY_PREFIX)], mock_data=False)
        if derived is not None:
            derived += [(key, params[key], "primus.tiny_assets")
                        for key in ("tokenizer_type", "tokenizer_model", "data_path", "mock_data")]
    return params
