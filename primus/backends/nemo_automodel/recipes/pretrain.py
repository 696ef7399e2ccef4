"""Wan 2.2 pretraining: the trained expert built from ``model.pipeline_spec`` (random init)."""
from __future__ import annotations

from primus.backends.nemo_automodel.config import from_pipeline_spec
from primus.backends.nemo_automodel.recipes.diffusion import WanRecipe


class WanPretrain(WanRecipe):
    stage = "pretrain"
    mode = "pretrain"
    weights = staticmethod(from_pipeline_spec)
