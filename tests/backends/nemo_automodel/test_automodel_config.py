"""The handoff to AutoModel: Primus keys never leak, unknown AutoModel keys are errors."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from primus.backends.nemo_automodel import schema
from primus.backends.nemo_automodel.adapter import AutoModelAdapter
from primus.backends.nemo_automodel.config import build_handoff, from_pipeline_spec, from_pretrained
from primus.config.errors import ConfigError
from primus.runtime.adapter import CheckpointSpec, EnginePlan, ModuleConfig
from tests.backends.nemo_automodel.conftest import resolve_example

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "nemo_automodel").glob("*.yaml"))


def _handoff(params, stage="pretrain"):
    module = ModuleConfig("pre_trainer", "nemo_automodel", stage, params)
    plan = EnginePlan(module, None, 1, None, CheckpointSpec(Path("/run/checkpoints")))
    weights = from_pipeline_spec if stage == "pretrain" else from_pretrained
    return build_handoff(params, mode=stage, weights=weights, checkpoint_dir=Path("/run/checkpoints"), dist_backend="gloo", plan=plan)


def _plan(params, stage="pretrain"):
    return AutoModelAdapter().plan(ModuleConfig("pre_trainer", "nemo_automodel", stage, params), 1)


def _walk_keys(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}", key
            yield from _walk_keys(value, f"{prefix}{key}.")


def test_no_primus_key_reaches_automodel(tiny_params):
    _, params = tiny_params()
    cfg = _handoff(params)
    assert "primus" in params and "primus" not in cfg, "the primus: block leaked into AutoModel's config"
    assert set(cfg) <= schema.TOP_LEVEL
    schema.check(cfg)


@pytest.mark.parametrize("block", ["metrics", "logging"])
def test_a_block_automodel_does_not_read_is_an_error_not_dropped(tiny_params, block):
    """AutoModel's hand-off used to strip `metrics:` and `logging:` silently."""
    _, params = tiny_params(**{block: {"foo": 1}})
    with pytest.raises(ConfigError, match=f"unknown AutoModel key '{block}'"):
        _plan(params)


def test_three_mistakes_are_reported_together(tiny_params):
    _, params = tiny_params(flow_matchng={}, fsdp={"activation_checkpointng": True}, optimizer={"weight_decya": 0.1})
    with pytest.raises(ConfigError) as error:
        _plan(params)
    assert len(error.value.lines()) == 3
    assert {e.key for e in error.value.errors} == {"flow_matchng", "fsdp.activation_checkpointng",
                                                    "optimizer.weight_decya"}


def test_primus_owns_mode_checkpoint_dir_and_backend(tiny_params):
    _, params = tiny_params(checkpoint={"checkpoint_dir": "/elsewhere"})
    cfg = _handoff(params)
    assert cfg["model"]["mode"] == "pretrain"
    assert cfg["checkpoint"]["checkpoint_dir"] == "/run/checkpoints"
    assert cfg["dist_env"]["backend"] == "gloo"
    finetune = _handoff(params, stage="finetune")
    assert finetune["model"]["mode"] == "finetune" and "pipeline_spec" not in finetune["model"]
    with pytest.raises(ConfigError, match="contradicts stage"):
        _handoff({**params, "model": {**params["model"], "mode": "finetune"}})


def test_pretrain_reads_boundary_ratio_from_the_pipeline(tiny_params):
    _, params = tiny_params(model={"stage": "low_noise"})
    del params["model"]["boundary_ratio"], params["model"]["pipeline_spec"]
    model = _handoff(params)["model"]
    assert model["boundary_ratio"] == 0.875 and model["pipeline_spec"]["subfolder"] == "transformer_2"


@pytest.mark.parametrize("override,message", [
    ({"flow_matchng": {}}, "'flow_matchng' (did you mean 'flow_matching'?)"),
    ({"flow_matching": {"flow_shfit": 5.0}}, "'flow_matching.flow_shfit' (did you mean 'flow_shift'?)"),
    ({"fsdp": {"activation_checkpointng": True}}, "did you mean 'activation_checkpointing'?"),
    ({"optimizer": {"weight_decya": 0.1}}, "'optimizer.weight_decya' (did you mean 'weight_decay'?)"),
    ({"step_scheduler": {"max_step": 3}}, "did you mean 'max_steps'?"),
    ({"data": {"dataloader": {"num_worker": 1}}}, "'data.dataloader.num_worker' (did you mean 'num_workers'?)"),
    ({"model": {"attention_backnd": "flash"}}, "did you mean 'attention_backend'?"),
    ({"checkpoint": {"save_consolidate": True}}, "did you mean 'save_consolidated'?"),
])
def test_unknown_automodel_keys_are_errors(tiny_params, override, message):
    _, params = tiny_params(**override)
    with pytest.raises(ConfigError, match=re.escape(message)):
        _plan(params)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_validates(example):
    stage, params = resolve_example(example)
    _plan(params, stage)


def test_schema_matches_the_recipe_source():
    """Every key the 0.7.0 recipe reads is known here: a newer AutoModel that reads more fails this."""
    from nemo_automodel.recipes.diffusion import train

    source = inspect.getsource(train)
    model_keys = set(re.findall(r'cfg\.get\(\s*"model\.(\w+)"', source))
    fm_keys = set(re.findall(r'fm_cfg\.get\(\s*"(\w+)"', source))
    assert model_keys <= schema.MODEL, model_keys - schema.MODEL
    assert fm_keys <= schema.FLOW_MATCHING, fm_keys - schema.FLOW_MATCHING


def test_missing_engine_names_the_extra(monkeypatch):
    monkeypatch.setattr(AutoModelAdapter, "installed_version", lambda self: None)
    with pytest.raises(ConfigError, match=r"primus prepare automodel"):
        _plan({})
