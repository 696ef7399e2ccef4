"""The tiny Wan plan is the same before ``prepare`` builds the pipeline and latent cache as after."""
from __future__ import annotations

from primus.backends.nemo_automodel.plan import plan_inputs


def _params(root):
    return {"primus": {"tiny_assets": str(root)},
            "model": {"pretrained_model_name_or_path": str(root / "pipeline"), "stage": "high_noise"},
            "data": {"dataloader": {"cache_dir": str(root / "cache"), "base_resolution": [64, 64]}}}


def test_the_plan_describes_the_tiny_assets_before_they_exist(tiny_root, tmp_path):
    assert not (tmp_path / "pipeline").exists()
    before = plan_inputs(_params(tmp_path), world_size=1)
    after = plan_inputs(_params(tiny_root), world_size=1)  # built by the session fixture, as prepare does
    assert before == after
