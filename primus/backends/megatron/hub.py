"""What a Megatron run reads that AMD's experiment files name by Hugging Face Hub id: the model to start
from (``hf_path``), the instruction data (``sft_dataset_name``, ``sft_valid_dataset_name``) and the
tokenizer (``tokenizer_model``). The recipe's ``prepare`` fetches them once per node (``compat.hub``)."""
from __future__ import annotations

from typing import Any

from primus.compat.hub import is_hub_id, localize
from primus.runtime.adapter import Derived

HUB_KEYS = [("hf_path", "model"), ("sft_dataset_name", "dataset"), ("sft_valid_dataset_name", "dataset")]


def localize_hub_references(params: dict[str, Any]) -> list[Derived]:
    """Each Hub id of ``params`` -> its local copy in this node's HF cache; a mock-data run's tokenizer
    is not fetched at all (random tokens need none: ``NullTokenizer``, the model's vocab_size)."""
    token = (params.get("primus") or {}).get("hf_token")
    found = [Derived(*item) for item in localize(params, HUB_KEYS, token=token)]
    reference = params.get("tokenizer_model")
    if not is_hub_id(reference):
        return found
    real_data = any(params.get(k) for k in ("data_path", "train_data_path", "valid_data_path", "test_data_path"))
    if params.get("mock_data") and not real_data and params.get("vocab_size"):
        return [*found, Derived("tokenizer_type", "NullTokenizer", f"mock_data: random tokens need no tokenizer, "
                                f"so '{reference}' is not fetched; vocab_size {params['vocab_size']} from the model")]
    return [*found, *(Derived(*item) for item in localize(params, [("tokenizer_model", "tokenizer")], token=token))]
