"""Megatron pretraining: megatron-core's GPT on indexed ``.bin/.idx`` data (or mock data), optionally
from a Hugging Face checkpoint's weights (``hf_path``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from primus.backends.megatron.post_training import MegatronPostTrainingKeys
from primus.backends.megatron.recipes.common import MegatronRecipe
from primus.config.provenance import error_at
from primus.runtime.adapter import ModuleConfig

if TYPE_CHECKING:
    from primus.config.provenance import Provenance


class MegatronPretrain(MegatronRecipe):
    stage = "pretrain"

    def instructions(self, keys: MegatronPostTrainingKeys, module: ModuleConfig, provenance: "Provenance | None"):
        if keys.sft_dataset_name:
            raise error_at(provenance, f"{module.prefix}.sft_dataset_name", "instruction data is read by stage: "
                           f"sft (this module's stage is {self.stage})")
        return None
