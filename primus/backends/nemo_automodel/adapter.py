"""NeMo AutoModel behind the adapter contract: Wan 2.2 text-to-video (``TrainDiffusionRecipe``) and
Hugging Face LLM fine-tuning (``TrainFinetuneRecipeForNextTokenPrediction``). Its recipes: ``recipes/``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from primus.runtime.adapter import BackendAdapter

LLM_RECIPE = "TrainFinetuneRecipeForNextTokenPrediction"


class AutoModelAdapter(BackendAdapter):
    name: ClassVar[str] = "nemo_automodel"
    distribution: ClassVar[str] = "nemo-automodel"
    import_probe: ClassVar[str | None] = "nemo_automodel.recipes.diffusion.train"
    extra: ClassVar[str] = "automodel"
    patches = "primus.backends.nemo_automodel.patches"
    recipes: ClassVar[Mapping[str, str]] = {
        "pretrain": "primus.backends.nemo_automodel.recipes.pretrain:WanPretrain",
        "finetune": "primus.backends.nemo_automodel.recipes.finetune:WanFinetune",
        "sft": "primus.backends.nemo_automodel.recipes.sft:AutoModelSFT",
        "lora": "primus.backends.nemo_automodel.recipes.lora:AutoModelLoRA",  # around sft: a `peft:` block
    }
    data_commands: ClassVar[tuple[str, ...]] = ("primus.data.diffusion.cli",)

    def wants_lora(self, params: Mapping[str, Any]) -> bool:
        """A ``peft:`` block on the LLM recipe."""
        return bool(params.get("peft")) and params.get("recipe") == LLM_RECIPE
