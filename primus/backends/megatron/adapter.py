"""The Megatron backend: megatron-core's GPTModel, DDP, optimizer, schedules and dist_checkpointing,
configured with Megatron-LM argument names. Its recipes: ``recipes/`` (the table below)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from primus.config.errors import ConfigError
from primus.runtime.adapter import BackendAdapter


class MegatronAdapter(BackendAdapter):
    name = "megatron"
    distribution = "megatron-core"
    patches = "primus.backends.megatron.patches"
    honours = frozenset({"sanitize_nan_grads"})
    import_probe = "megatron.core.models.gpt"
    extra = "megatron"
    recipes = {
        "pretrain": "primus.backends.megatron.recipes.pretrain:MegatronPretrain",
        "sft": "primus.backends.megatron.recipes.sft:MegatronSFT",
        "lora": "primus.backends.megatron.recipes.lora:MegatronLoRA",  # around pretrain or sft: `lora: {enabled: true}`
    }
    data_commands = ("primus.backends.megatron.data_cli",)
    plans_without_engine = True  # plan() reads Megatron-LM's argument table only: `config validate --no-engine`

    def wants_lora(self, params: Mapping[str, Any]) -> bool:
        """AMD Primus's ``lora:`` block, enabled (a block that does not parse goes to the LoRA recipe,
        which names the wrong key)."""
        if "lora" not in params:
            return False
        from primus.backends.megatron.lora import parse_lora

        try:
            return parse_lora(params["lora"], "lora").enabled
        except ConfigError:
            return True
