"""Megatron supervised fine-tuning: instruction data (``sft_dataset_name``, loss on response tokens
only, padded or packed) on megatron-core's loop, usually from a Hugging Face checkpoint (``hf_path``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from primus.backends.megatron.post_training import MegatronPostTrainingKeys, instruction_spec
from primus.backends.megatron.recipes.common import MegatronRecipe
from primus.config.provenance import error_at
from primus.data.sft import SFTDataSpec
from primus.runtime.adapter import ModuleConfig

if TYPE_CHECKING:
    from primus.config.provenance import Provenance


class MegatronSFT(MegatronRecipe):
    stage = "sft"

    def instructions(self, keys: MegatronPostTrainingKeys, module: ModuleConfig,
                     provenance: "Provenance | None") -> SFTDataSpec:
        if not keys.sft_dataset_name:
            raise error_at(provenance, f"{module.prefix}.sft_dataset_name",
                           "stage sft needs instruction data (a JSONL file or folder)")
        return instruction_spec(keys)
