"""Megatron arguments: unknown keys, parallel layouts, the neutral model block (no engine run)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primus.backends.megatron.adapter import MegatronAdapter, megatron_params
from primus.backends.megatron.arguments import (
    TRANSLATED_KEYS,
    check_parallel_layout,
    default_args,
    parse_args,
    translate_neutral_model,
)
from primus.config.errors import ConfigError
from primus.runtime.adapter import ModuleConfig

REPO = Path(__file__).resolve().parents[3]
TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
        "train_iters": 10, "lr": 1e-3, "mock_data": True, "vocab_size": 512, "micro_batch_size": 1}


def params(**overrides):
    return {**TINY, **overrides}


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_unknown_key_names_dotted_key_and_suggests():
    with pytest.raises(ConfigError) as exc:
        parse_args(params(lr_warmup_iter=5))
    assert one_line(exc) == ("modules.pre_trainer.lr_warmup_iter: unknown Megatron argument "
                             "(did you mean 'lr_warmup_iters'?)")


def test_error_carries_provenance_location():
    class Provenance:
        def describe(self, key):
            return "exp.yaml:12" if key == "modules.pre_trainer.tensor_model_paralel_size" else None

    with pytest.raises(ConfigError) as exc:
        parse_args(params(tensor_model_paralel_size=2), provenance=Provenance())
    assert one_line(exc).startswith("exp.yaml:12: modules.pre_trainer.tensor_model_paralel_size: unknown")
    assert "did you mean 'tensor_model_parallel_size'" in str(exc.value)


def test_bad_value_type_names_key_and_value():
    with pytest.raises(ConfigError) as exc:
        parse_args(params(micro_batch_size="four"))
    assert one_line(exc).startswith("modules.pre_trainer.micro_batch_size:")
    assert "'four'" in str(exc.value)


@pytest.mark.parametrize("overrides, world, expected", [
    ({"tensor_model_parallel_size": 3}, None,
     "num_attention_heads (4) is not divisible by tensor_model_parallel_size (3)"),
    ({"group_query_attention": True, "num_query_groups": 2, "tensor_model_parallel_size": 4}, None,
     "num_query_groups (2) is not divisible by tensor_model_parallel_size (4)"),
    ({"pipeline_model_parallel_size": 4, "account_for_loss_in_pipeline_split": True}, None,
     "num_layers (4) is not divisible by pipeline_model_parallel_size (4)"),
    ({"pipeline_model_parallel_size": 2, "num_layers_per_virtual_pipeline_stage": 3}, None,
     "layers per pipeline stage (4 / 2 = 2) is not divisible by num_layers_per_virtual_pipeline_stage (3)"),
    ({"tensor_model_parallel_size": 2}, 3,
     "world size (3) is not divisible by tensor_model_parallel_size x pipeline_model_parallel_size (2 x 1 = 2)"),
    ({"context_parallel_size": 2, "seq_length": 66}, None,
     "seq_length (66) is not a multiple of 2 x context_parallel_size (4): each context-parallel rank takes two "
     "chunks (Megatron-LM's rule)"),
    ({"context_parallel_size": 4, "cp_comm_type": ["a2a+p2p"], "hierarchical_context_parallel_sizes": [2, 3]},
     None, "hierarchical_context_parallel_sizes [2, 3] does not multiply to context_parallel_size (4)"),
    ({"context_parallel_size": 2, "micro_batch_size": 1, "global_batch_size": 3}, 4,
     "global_batch_size (3) is not divisible by micro_batch_size x data-parallel size (1 x 2 = 2)"),
    ({"micro_batch_size": 2, "global_batch_size": 6}, 2,
     "global_batch_size (6) is not divisible by micro_batch_size x data-parallel size (2 x 2 = 4)"),
    ({"micro_batch_size": 4, "global_batch_size": 6}, None, "global_batch_size (6) is not divisible by micro_batch_size (4)"),
    ({"context_parallel_size": 2}, 3, "world size (3) is not divisible by tensor_model_parallel_size x "
     "pipeline_model_parallel_size x context_parallel_size (1 x 1 x 2 = 2)"),
])
def test_bad_parallel_layouts_are_one_clear_line(overrides, world, expected):
    with pytest.raises(ConfigError) as exc:
        args = parse_args(params(**overrides))
        check_parallel_layout(args, world)
    assert one_line(exc) == f"modules.pre_trainer: {expected}"


def test_context_parallel_ranks_are_not_data_parallel():
    # Megatron-LM: data_parallel_size = world / (tp x pp x cp); 4 ranks at cp 2 are 2 data-parallel ranks
    args = parse_args(params(context_parallel_size=2, micro_batch_size=1, global_batch_size=2))
    assert check_parallel_layout(args, 4) == 2


def test_good_layout_returns_data_parallel_size():
    args = parse_args(params(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, global_batch_size=16))
    assert check_parallel_layout(args, 8) == 2


def test_neutral_model_block_translates_and_flat_keys_override():
    spec = yaml.safe_load((REPO / "primus/configs/models/common/llama3_tiny.yaml").read_text())["model"]
    translated = translate_neutral_model(spec)
    assert translated["num_layers"] == spec["n_layers"] and translated["hidden_size"] == spec["dim"]
    assert translated["num_query_groups"] == spec["n_kv_heads"] and translated["group_query_attention"]
    assert translated["normalization"] == "RMSNorm" and translated["swiglu"] and translated["position_embedding_type"] == "rope"
    assert translated["untie_embeddings_and_output_weights"] is True
    args = parse_args({"model": spec, "num_layers": 4, "seq_length": 64, "train_iters": 2, "lr": 1e-3, "mock_data": True,
                       "micro_batch_size": 1})
    assert args.num_layers == 4  # the flat Megatron key wins
    assert args.hidden_size == spec["dim"] and args.rotary_base == spec["rope_theta"]
    assert args.ffn_hidden_size == 352


def test_neutral_embedding_init_std_maps_to_megatron_and_unset_keeps_the_default():
    pytest.importorskip("megatron.core")
    from primus.backends.megatron.model import Derived, transformer_config

    model = {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 512}
    rest = {"seq_length": 64, "train_iters": 2, "lr": 1e-3, "mock_data": True, "micro_batch_size": 1}
    args = parse_args({"model": {**model, "embedding_init_std": 1.0}, **rest})
    derived = Derived()
    config = transformer_config(args, on_gpu=False, derived=derived)
    assert config.embedding_init_method_std == 1.0 and config.init_method_std == 0.02
    assert "embedding_init_method_std" not in derived.values
    # unset: megatron-core's own default (init_method_std), logged as derived with the difference
    derived = Derived()
    config = transformer_config(parse_args({"model": model, **rest}), on_gpu=False, derived=derived)
    assert config.embedding_init_method_std == 0.02
    assert derived.values["embedding_init_method_std"] == 0.02 and "TorchTitan" in derived.reasons["embedding_init_method_std"]
    # the flat Megatron-LM argument wins over the neutral key, as for every other key
    args = parse_args({"model": {**model, "embedding_init_std": 1.0}, "embedding_init_method_std": 0.5, **rest})
    assert args.embedding_init_method_std == 0.5
    with pytest.raises(ConfigError, match="model.embedding_init_std"):
        parse_args({"model": {**model, "embedding_init_std": 0}, **rest})


def test_neutral_model_error_points_into_model_block():
    with pytest.raises(ConfigError) as exc:
        parse_args({"model": {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 8, "n_layer": 3}, **TINY})
    assert one_line(exc).startswith("modules.pre_trainer.model.n_layer: unknown")
    assert "did you mean 'n_layers'" in str(exc.value)


def test_defaults_layer_is_empty_and_the_preset_is_megatron_lm():
    """Megatron-LM's defaults are the schema's own: no defaults layer can hide a model preset's
    value (nor an option spelling such as disable_bias_linear)."""
    assert default_args() == {}
    preset = yaml.safe_load((REPO / "primus/configs/modules/megatron/pre_trainer.yaml").read_text())
    assert not TRANSLATED_KEYS & set(preset)
    parse_args({**preset, **params()})  # every preset key is a known Megatron argument


def test_adapter_plan_accepts_the_primus_block_only_with_known_keys(tmp_path):
    adapter = MegatronAdapter()
    tiny = {k: v for k, v in params().items() if k != "mock_data"}
    adapter.plan(ModuleConfig("pre_trainer", "megatron", "pretrain", {**tiny, "primus": {"tiny_assets": str(tmp_path)}}), 1)
    with pytest.raises(ConfigError, match="primus.tiny_asset"):
        adapter.plan(ModuleConfig("pre_trainer", "megatron", "pretrain", {**tiny, "primus": {"tiny_asset": "x"}}), 1)


@pytest.mark.parametrize("example", sorted((REPO / "examples/megatron").glob("*.yaml")), ids=lambda p: p.name)
def test_example_experiments_validate(example, monkeypatch):
    """Each example, resolved as `primus` resolves it (defaults < preset < model < overrides), parses."""
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults

    monkeypatch.chdir(REPO)
    resolved = resolve_experiment(example, [], backend_defaults)
    module = resolved.modules["pre_trainer"]
    assert module.framework == "megatron"
    parse_args(megatron_params(module.params))


def test_gpu_fusions_only_where_their_kernels_are_installed():
    """Here (no Transformer Engine, Apex or Megatron-LM extensions) a GPU run keeps megatron-core's
    own jit fusions and turns the rest off, saying which; the H200 run crashed without this."""
    pytest.importorskip("megatron.core")
    from primus.backends.megatron.model import Derived, fusion_flags

    derived = Derived()
    args = parse_args(params(position_embedding_type="rope"))  # Megatron-LM's fusion defaults: all on
    flags = fusion_flags(args, True, derived)
    assert flags["bias_activation_fusion"] and flags["bias_dropout_fusion"]
    off = {"masked_softmax_fusion", "persist_layer_norm", "apply_rope_fusion", "gradient_accumulation_fusion"}
    assert not any(flags[name] for name in off)
    assert set(derived.values["fusions_off"].split(",")) == off
    assert not any(fusion_flags(args, False, Derived()).values())


# ---------------------------------------------------------------- pipeline_model_parallel_layout

def test_a_pipeline_layout_replaces_the_even_split_rule():
    # Megatron-LM skips "num_layers divisible by pp" when the layout says where each layer goes
    # (AMD's Qwen3-235B: 94 layers on PP 4 as "Et*5|t*6|...|t*5,L")
    args = parse_args(params(num_layers=5, pipeline_model_parallel_size=2,
                             pipeline_model_parallel_layout="Et*2|t*3,L"))
    assert check_parallel_layout(args, 2) == 1
    with pytest.raises(ConfigError):  # 5 layers where the user chose the split: Megatron-LM's even-split rule
        check_parallel_layout(parse_args(params(num_layers=5, pipeline_model_parallel_size=2,
                                                account_for_embedding_in_pipeline_split=True,
                                                account_for_loss_in_pipeline_split=True)), 2)


@pytest.mark.parametrize("num_layers, pp, mtp, layout", [
    (126, 8, 0, "Et*15|t*16|t*16|t*16|t*16|t*16|t*16|t*15,L"),  # AMD's Llama 3.1 405B on PP 8
    (61, 8, 0, "Et*6|t*8|t*8|t*8|t*8|t*8|t*8|t*7,L"),  # AMD's Kimi-K2 on PP 8
    (5, 2, 1, "Et*2|t*3,m,L"),
])
def test_layers_that_do_not_divide_over_the_stages_get_a_balanced_layout(num_layers, pp, mtp, layout):
    """Megatron-LM refuses num_layers % pp != 0 without a split: the derived layout counts the embedding
    and the loss as a layer each, stages differ by at most one layer, and a warning says so."""
    from primus.plan.layout import parse_pipeline_layout

    args = parse_args(params(num_layers=num_layers, pipeline_model_parallel_size=pp, mtp_num_layers=mtp or None,
                             num_attention_heads=4, hidden_size=64))
    assert args.pipeline_model_parallel_layout == layout
    assert check_parallel_layout(args, pp) == 1
    sizes = [len(stage) for stage in parse_pipeline_layout(layout)]
    assert max(sizes) - min(sizes) <= 1 + mtp
    assert any(key == "pipeline_model_parallel_layout" and level == "warning" and "Megatron-LM refuses" in why
               for key, _, why, level in args.notes)


def test_a_layout_without_the_models_mtp_layer_gets_it_on_the_last_stage():
    """AMD's DeepSeek-V3 file: a 61-layer layout, no 'm', a preset with mtp_num_layers 1."""
    args = parse_args(params(num_layers=4, pipeline_model_parallel_size=2, mtp_num_layers=1,
                             pipeline_model_parallel_layout="Et*2|t*2,L"))
    assert args.pipeline_model_parallel_layout == "Et*2|t*2,m,L"
    assert check_parallel_layout(args, 2) == 1


def test_a_pipeline_layout_gives_the_virtual_stages():
    from primus.backends.megatron.validate_args import virtual_pipeline_size

    args = parse_args(params(num_layers=6, pipeline_model_parallel_size=2,
                             pipeline_model_parallel_layout="Et|(t|)*4,tL"))
    assert virtual_pipeline_size(args) == 3


@pytest.mark.parametrize("overrides, expected", [
    ({"pipeline_model_parallel_layout": "Et*2|t*3,L"}, "places 5 decoder layers (t); num_layers is 4"),
    ({"pipeline_model_parallel_layout": "Et*2|t|t,L"}, "3 stages are not divisible by pipeline_model_parallel_size (2)"),
    ({"pipeline_model_parallel_layout": "t*2|t*2,L"}, "must start with the embedding (E)"),
    ({"pipeline_model_parallel_layout": "Et*2|t*2x,L"}, "unknown layer character(s) 'x'"),
    ({"pipeline_model_parallel_layout": "Et*2|t*2,m,m,L", "mtp_num_layers": 1}, "places 2 MTP layers (m); mtp_num_layers is 1"),
    ({"pipeline_model_parallel_layout": "Et*2|mt*2,L", "mtp_num_layers": 1}, "decoder layers (t) must come before"),
    ({"pipeline_model_parallel_layout": "Et*2|t*2,L", "num_virtual_stages_per_pipeline_rank": 2},
     "excludes num_virtual_stages_per_pipeline_rank"),
    ({"pipeline_model_parallel_layout": "Et*2|t*2,L", "decoder_first_pipeline_num_layers": 2},
     "excludes decoder_first_pipeline_num_layers"),
])
def test_bad_pipeline_layouts_are_one_line_naming_the_key(overrides, expected):
    with pytest.raises(ConfigError) as exc:
        check_parallel_layout(parse_args(params(pipeline_model_parallel_size=2, **overrides)), 2)
    assert one_line(exc).startswith("modules.pre_trainer.pipeline_model_parallel_layout: ")
    assert expected in str(exc.value)


def test_a_blend_written_as_one_string_is_split_as_megatron_lms_command_line_splits_it():
    """AMD's MLPerf files: train_data_path: "10 /data/c4-train…" is a weight and a prefix."""
    from primus.backends.megatron.data import blend

    args = parse_args(params(train_data_path="10 /data/c4-train", valid_data_path="/data/c4-valid",
                             test_data_path=None, data_path=None, split=None, mock_data=False,
                             tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/tok"))
    assert args.train_data_path == ["10", "/data/c4-train"] and args.valid_data_path == ["/data/c4-valid"]
    assert blend(args.train_data_path) == (["/data/c4-train"], [10.0])
