"""What the compatibility layer does when a run starts (the translations themselves happen at resolve).

- admission (``primus.runtime.admission``: ``config validate``, ``plan``, ``train --dry-run`` and the
  launch) refuses a run whose experiment turns on an AMD feature its target cannot run
  (``refuse_at_run``, decided per target where the note names a ``primus.runtime.capabilities`` row);
- each rank logs the ``translated …`` lines once, and for every AMD kernel switch that is on, a
  ``derived … (Primus-Turbo not installed)`` line naming the kernel that runs instead;
- a tokenizer, a model to start from or instruction data named by Hugging Face Hub id is fetched
  into the HF cache (``hub.py``) and the run reads the local copy.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from primus.compat.hub import HubTimeouts, fetch, is_hub_id
from primus.compat.rules import Translation

# The key naming a backend's tokenizer directory (or Hub id).
TOKENIZER_KEYS = {"megatron": "tokenizer_model", "torchtitan": "hf_assets_path"}
# Other keys a run reads that AMD's files fill with Hub ids: (key, what is fetched).
HUB_KEYS = {"megatron": [("hf_path", "model"), ("sft_dataset_name", "dataset"), ("sft_valid_dataset_name", "dataset")]}


def translations_of(section: dict[str, Any]) -> list[Translation]:
    """The translations saved with a module of ``config.resolved.yaml`` (``modules.<m>.translated``)."""
    return [Translation.from_dict(entry) for entry in section.get("translated") or []]


def announce(translations: list[Translation], log: Callable[[str], None],
             log_derived: Callable[[str, object, str], None]) -> None:
    """One ``translated …`` line per AMD key; the kernel that runs for each AMD kernel switch that is on."""
    turbo = "Primus-Turbo not installed" if importlib.util.find_spec("primus_turbo") is None \
        else "Primus does not call Primus-Turbo"
    for translation in translations:
        log(translation.line())
        if translation.kind == "kernel":
            log_derived(translation.source, "stock kernel", turbo)


def localize_hub_references(framework: str, params: dict[str, Any], *, local_rank: int,
                            log_derived: Callable[[str, object, str], None]) -> dict[str, Any]:
    """``params`` with every Hub id the run reads (tokenizer, model to start from, instruction data)
    replaced by its local snapshot, fetched once per node into the HF cache."""
    if (params.get("primus") or {}).get("tiny_assets"):
        return params
    for key, kind in HUB_KEYS.get(framework, []):
        reference = params.get(key)
        if is_hub_id(reference):
            path = fetch(reference, kind, key=key, local_rank=local_rank, timeouts=HubTimeouts.of(params))
            params = {**params, key: str(path)}
            log_derived(key, path, f"Hugging Face Hub '{reference}', fetched once into the HF cache")
    return _localize_hub_tokenizer(framework, params, local_rank=local_rank, log_derived=log_derived)


def _localize_hub_tokenizer(framework: str, params: dict[str, Any], *, local_rank: int,
                            log_derived: Callable[[str, object, str], None]) -> dict[str, Any]:
    key = TOKENIZER_KEYS.get(framework)
    reference = params.get(key) if key else None
    if not is_hub_id(reference):
        return params
    params = dict(params)
    if framework == "megatron" and _mock_needs_no_tokenizer(params):
        params["tokenizer_type"] = "NullTokenizer"
        log_derived("tokenizer_type", "NullTokenizer", f"mock_data: random tokens need no tokenizer, so "
                    f"'{reference}' is not fetched; vocab_size {params['vocab_size']} from the model")
        return params
    path = fetch(reference, "tokenizer", key=key, local_rank=local_rank, timeouts=HubTimeouts.of(params))
    params[key] = str(path)
    log_derived(key, path, f"Hugging Face Hub '{reference}', fetched once into the HF cache")
    return params


def _mock_needs_no_tokenizer(params: dict[str, Any]) -> bool:
    real_data = any(params.get(k) for k in ("data_path", "train_data_path", "valid_data_path", "test_data_path"))
    return bool(params.get("mock_data")) and not real_data and bool(params.get("vocab_size"))
