"""FP8 and context parallelism on Megatron (``primus/backends/megatron/te_features.py``): admitted on a GPU
with Transformer Engine (and, for FP8, the recipe's hardware), wired into megatron-core's TransformerConfig and
TE layer spec there; refused on CPU, or without Transformer Engine, with the reason. No Transformer Engine is
installed here: the GPU targets are described (``Target``), which is all the decision reads."""
from __future__ import annotations

import pytest

from primus.backends.megatron import te_features
from primus.backends.megatron.admission import check_arguments
from primus.backends.megatron.arguments import parse_args
from primus.config.errors import ConfigError
from primus.plan.target import Target, named_target
from primus.runtime.admission import Admission

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "train_iters": 10,
        "lr": 1e-3, "mock_data": True, "vocab_size": 512, "micro_batch_size": 1, "bf16": True}
CPU = Target("cpu")
H100 = Target("cuda", (9, 0), "NVIDIA H100 80GB HBM3", transformer_engine=True)  # as host_target() reads one
H100_NO_TE = Target("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
FP8 = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param_gather": True, "use_distributed_optimizer": True,
       "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1}
CP = {"context_parallel_size": 2, "cp_comm_type": ["p2p"]}


def args_of(**overrides):
    return parse_args({**TINY, **overrides})


def admit(target: Target, **overrides):
    """The notes admission logs; raises the one line a refused launch prints."""
    args = args_of(**overrides)
    refused, notes = check_arguments(args, target)
    if refused:
        raise ConfigError(Admission(target, "pre_trainer", refused).error())
    return notes


def refusal_of(target: Target, **overrides) -> str:
    with pytest.raises(ConfigError) as exc:
        admit(target, **overrides)
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- on a GPU with Transformer Engine

@pytest.mark.parametrize("target", [H100, named_target("mi300x"), named_target("mi355x"), named_target("b200")],
                         ids=lambda t: t.name)
def test_fp8_and_context_parallel_are_admitted_on_a_gpu_with_transformer_engine(target):
    assert admit(target, **FP8, **CP) == []
    assert admit(target, fp8="e4m3", fp8_recipe="delayed", fp8_amax_history_len=1024,
                 fp8_amax_compute_algo="max") == []


def test_what_primus_builds_for_a_gpu_with_transformer_engine(monkeypatch):
    """The decision for a target with TE: TE layers, and megatron-core's TransformerConfig carrying FP8 and
    context parallel as Megatron-LM's core_transformer_config_from_args fills them."""
    pytest.importorskip("megatron.core")
    from primus.backends.megatron import model

    args = args_of(**FP8, **CP)
    derived = model.Derived()
    assert model.use_transformer_engine(args, H100, derived)
    assert derived.values["transformer_impl"] == "transformer_engine"
    config = model.transformer_config(args, on_gpu=False, derived=derived, use_te=True)  # CPU init: no CUDA here
    assert config.transformer_impl == "transformer_engine"
    assert (config.fp8, config.fp8_recipe, config.fp8_param) == ("hybrid", "tensorwise", True)
    assert (config.first_last_layers_bf16, config.num_layers_at_start_in_bf16, config.num_layers_at_end_in_bf16) \
        == (True, 1, 1)
    assert (config.context_parallel_size, config.cp_comm_type) == (2, "p2p")

    assert model.optimizer_config(args).fp8_recipe == "tensorwise"  # the distributed optimizer shards by recipe

    calls = []
    monkeypatch.setattr("megatron.core.models.gpt.gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec",
                        lambda **kw: calls.append(kw) or "te-spec")
    assert model.layer_spec(args, config, use_te=True, vp_stage=None) == "te-spec"
    assert calls == [{"qk_layernorm": False, "multi_latent_attention": False}]


def test_without_fp8_or_cp_the_config_keeps_megatron_core_defaults():
    pytest.importorskip("megatron.core")
    from primus.backends.megatron import model

    config = model.transformer_config(args_of(), on_gpu=False, derived=model.Derived())
    assert (config.fp8, config.fp8_param, config.context_parallel_size) == (None, False, 1)


# ---------------------------------------------------------------- refused, with the reason

def test_on_cpu_fp8_and_context_parallel_are_refused_with_the_reason():
    assert refusal_of(CPU, fp8="e4m3") == (
        "modules.pre_trainer.fp8: 'e4m3' cannot run on a CPU host (FP8 training runs in Transformer Engine's "
        "layers on a GPU; megatron-core's local layers have no FP8)")
    assert refusal_of(CPU, context_parallel_size=2) == (
        "modules.pre_trainer.context_parallel_size: 2 cannot run on a CPU host (context parallelism splits "
        "attention in Transformer Engine's TEDotProductAttention on a GPU; megatron-core's local attention "
        "refuses it)")


def test_on_this_host_the_default_target_is_read():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU host")
    from primus.plan.target import host_target

    with pytest.raises(ConfigError, match="cannot run on a CPU host"):
        admit(host_target(), fp8="hybrid")


def test_a_gpu_without_transformer_engine_says_how_to_install_it():
    assert "Transformer Engine is not importable here (`primus prepare megatron --with-te` installs it)" in \
        refusal_of(H100_NO_TE, fp8="hybrid")
    assert "transformer_impl is local" in refusal_of(H100, context_parallel_size=2, transformer_impl="local")


@pytest.mark.parametrize("recipe, runs_on, refused_on", [
    ("delayed", ["h100", "b200", "mi300x", "mi355x"], ["a100"]),
    ("tensorwise", ["h100", "b200", "mi300x", "mi355x"], ["a100"]),
    ("blockwise", ["h100", "h200", "b200"], ["a100", "mi300x", "mi355x"]),
    ("mxfp8", ["b200", "mi355x"], ["a100", "h100", "mi300x"]),
])
def test_each_recipe_runs_where_transformer_engine_has_its_kernels(recipe, runs_on, refused_on):
    for device in runs_on:
        assert admit(named_target(device), fp8="hybrid", fp8_recipe=recipe) == [], device
    for device in refused_on:
        message = refusal_of(named_target(device), fp8="hybrid", fp8_recipe=recipe)
        assert message.startswith(f"modules.pre_trainer.fp8_recipe: '{recipe}' cannot run on {device} (")
        assert f"the {recipe} recipe needs {te_features.RECIPE_NEEDS[recipe]}" in message


@pytest.mark.parametrize("overrides, key, reason", [
    ({"fp8": "hybrid", "fp8_recipe": "delayed", "first_last_layers_bf16": True}, "fp8_recipe",
     "the delayed recipe cannot keep the first/last layers in bf16"),
    ({"fp8": "hybrid", "fp8_param_gather": True}, "fp8_param_gather", "needs use_distributed_optimizer"),
    ({"fp8": "hybrid", "fp8_recipe": "custom", "fp8_quantizer_factory": "my.factory"}, "fp8_recipe",
     "the custom recipe imports fp8_quantizer_factory's code, which Primus does not load"),
    ({"context_parallel_size": 2, "cp_comm_type": ["a2a+p2p"]}, "cp_comm_type",
     "a2a+p2p needs hierarchical_context_parallel_sizes"),
])
def test_megatron_rules_on_these_settings_are_one_line_before_any_rank_starts(overrides, key, reason):
    message = refusal_of(H100, **overrides)
    assert message.startswith(f"modules.pre_trainer.{key}: ") and reason in message


def test_settings_read_only_with_fp8_or_cp_are_said_to_do_nothing_without_them():
    notes = {key: why for key, _, why in admit(CPU, fp8_recipe="tensorwise", fp8_amax_history_len=1024,
                                               cp_comm_type=["a2a"])}
    assert notes == {"fp8_recipe": "accepted, no effect here: read only with fp8",
                     "fp8_amax_history_len": "accepted, no effect here: read only with fp8",
                     "cp_comm_type": "accepted, no effect here: read only with context_parallel_size > 1"}


def test_lora_with_fp8_is_refused_before_any_rank_starts():
    from primus.backends.megatron.adapter import _lora_on_te_layers
    from primus.runtime.adapter import ModuleConfig

    module = ModuleConfig("pre_trainer", "megatron", "sft", {"lora": {"enabled": True}})
    refused = _lora_on_te_layers(module, args_of(fp8="hybrid"))
    assert [r.line("pre_trainer") for r in refused] == [
        "modules.pre_trainer.lora: LoRA wraps megatron-core's local linears, and FP8 / context parallelism need "
        "Transformer Engine's layers: drop one"]
    assert _lora_on_te_layers(module, args_of()) == []  # LoRA alone: fine

