"""Names engines give the same setting, for did-you-mean: someone who writes TorchTitan's or Hugging
Face's name in a Megatron section (``rope_theta``, ``n_kv_heads``, ``expert_parallel_degree``) is
pointed at Megatron-LM's (``rotary_base``, ``num_query_groups``, ``expert_model_parallel_size``), and
the other way round. Spelling mistakes are left to ``difflib`` (``mock_date`` -> ``mock_data``).
"""
from __future__ import annotations

from collections.abc import Iterable

# Each group: one setting under the names Megatron-LM, TorchTitan / Primus's neutral model, Hugging
# Face and AutoModel use.
GROUPS: tuple[frozenset[str], ...] = tuple(frozenset(group) for group in (
    {"num_layers", "n_layers", "num_hidden_layers"},
    {"hidden_size", "dim", "d_model"},
    {"num_attention_heads", "n_heads"},
    {"num_query_groups", "n_kv_heads", "num_kv_heads", "num_key_value_heads"},
    {"ffn_hidden_size", "ffn_dim", "intermediate_size"},
    {"num_moe_experts", "num_experts", "n_experts", "n_routed_experts", "num_local_experts"},
    {"moe_router_topk", "top_k", "moe_topk", "num_experts_per_tok"},
    {"moe_ffn_hidden_size", "moe_intermediate_size", "moe_inter_dim"},
    {"rotary_base", "rope_theta"},
    {"layernorm_epsilon", "norm_epsilon", "norm_eps", "rms_norm_eps"},
    {"max_position_embeddings", "max_seq_len"},
    {"seq_length", "seq_len"},
    {"train_iters", "steps", "max_steps", "train_steps"},
    {"lr_warmup_iters", "warmup_steps", "lr_warmup_steps"},
    {"micro_batch_size", "local_batch_size"},
    {"tensor_model_parallel_size", "tensor_parallel_degree", "tp_size"},
    {"pipeline_model_parallel_size", "pipeline_parallel_degree", "pp_size"},
    {"context_parallel_size", "context_parallel_degree", "cp_size"},
    {"expert_model_parallel_size", "expert_parallel_degree", "ep_size"},
    {"expert_tensor_parallel_size", "expert_tensor_parallel_degree", "etp_size"},
    {"clip_grad", "max_norm"},
    {"tokenizer_model", "hf_assets_path", "tokenizer_path"},
))


def synonym_in(word: str, candidates: Iterable[str]) -> str | None:
    """The name ``candidates`` knows for the setting ``word`` names elsewhere, if any."""
    known = set(candidates)
    for group in GROUPS:
        if word in group:
            return next((name for name in sorted(group) if name in known and name != word), None)
    return None
