"""Wan 2.2 fine-tuning: the trained expert loaded from the pipeline's pretrained weights."""
from __future__ import annotations

from primus.backends.nemo_automodel.config import from_pretrained
from primus.backends.nemo_automodel.recipes.diffusion import WanRecipe


class WanFinetune(WanRecipe):
    stage = "finetune"
    mode = "finetune"
    weights = staticmethod(from_pretrained)
