"""The Megatron schema built from Megatron-LM's argument table: types, nulls, ranges, option
spellings, did-you-mean, Megatron-LM's validate_args rules, and the support classes (no engine run)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from primus.backends.megatron import support
from primus.backends.megatron.arguments import parse_args
from primus.backends.megatron.schema import megatron_lm_table, numeric_range
from primus.config.errors import ConfigError

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "train_iters": 10,
        "lr": 1e-3, "mock_data": True, "vocab_size": 512, "micro_batch_size": 1}


def params(**overrides):
    return {**TINY, **overrides}


def error_of(**overrides) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_args(params(**overrides))
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- types, nulls, ranges

def test_every_megatron_lm_argument_is_an_attribute_with_megatron_lm_default():
    args = parse_args(params())
    table = megatron_lm_table()
    assert len(table) == 671
    untouched = [d for d, a in table.items() if d not in TINY and getattr(args, d) != a.default
                 and not isinstance(a.default, (list, tuple))]
    # only what Megatron-LM's validate_args derives differs from the argparse default
    assert set(untouched) <= {"ffn_hidden_size", "kv_channels", "max_position_embeddings", "dataloader_type",
                              "start_weight_decay", "end_weight_decay", "expert_tensor_parallel_size",
                              "add_qkv_bias", "apply_rope_fusion"}, untouched


@pytest.mark.parametrize("key, value", [
    ("no_load_optim", None), ("no_save_rng", None), ("train_data_path", None), ("valid_data_path", None),
    ("test_data_path", None), ("expert_tensor_parallel_size", None), ("moe_router_dtype", None),
])
def test_megatron_lm_nulls_are_valid(key, value):
    assert getattr(parse_args(params(**{key: value})), key) == value or key == "expert_tensor_parallel_size"


def test_every_numeric_argument_has_a_range():
    numeric = [a for a in megatron_lm_table().values() if a.type in ("int", "float") and not a.choices]
    assert len(numeric) > 250
    assert all(numeric_range(a) is not None for a in numeric)


@pytest.mark.parametrize("key, value, expected", [
    ("tensor_model_parallel_size", 0, "greater than 0"),
    ("expert_model_parallel_size", -2, "greater than 0"),
    ("train_iters", 0, "greater than 0"),
    ("train_iters", True, "valid integer"),
    ("micro_batch_size", -1, "greater than 0"),
    ("lr_warmup_iters", -5, "greater than or equal to 0"),
    ("lr", float("inf"), "finite"),
    ("lr", float("nan"), "finite"),
    ("lr", True, "boolean"),
    ("hidden_dropout", 1.5, "less than or equal to 1"),
    ("adam_beta2", 1.0, "less than 1"),
    ("moe_router_topk", 0, "greater than 0"),
    ("num_experts", -4, "greater than or equal to 0"),
    ("position_embedding_type", "alibi", "'learned_absolute', 'rope'"),
    ("rampup_batch_size", [16, 8], "at least 3 items"),
    ("moe_aux_loss_coeff", -0.1, "greater than or equal to 0"),
])
def test_bad_values_are_one_line_naming_the_key(key, value, expected):
    message = error_of(**{key: value})
    assert message.startswith(f"modules.pre_trainer.{key}")
    assert expected in message


def test_nargs_arguments_take_a_scalar_or_a_list():
    args = parse_args(params(moe_router_load_balancing_type="seq_aux_loss", data_path=None, mock_data=True))
    assert args.moe_router_load_balancing_type == "seq_aux_loss"  # a one-item list becomes the scalar again
    args = parse_args(params(hierarchical_context_parallel_sizes=[2, 1]))
    assert args.hierarchical_context_parallel_sizes == [2, 1]


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("typo, suggestion", [
    ("mock_date", "mock_data"),
    ("expert_model_parallel_sise", "expert_model_parallel_size"),
    ("num_moe_experts", "num_experts"),  # megatron-core's name for Megatron-LM's argument
    ("moe_router_top_k", "moe_router_topk"),
    ("lr_warmup_iter", "lr_warmup_iters"),
])
def test_did_you_mean_over_the_real_names(typo, suggestion):
    assert error_of(**{typo: 1}) == (f"modules.pre_trainer.{typo}: unknown Megatron argument "
                                     f"(did you mean '{suggestion}'?)")


def test_option_spellings_map_to_the_dest_as_argparse_stores_them():
    args = parse_args(params(disable_bias_linear=True, norm_epsilon=1e-6, apply_layernorm_1p=True,
                             no_check_for_nan_in_loss_and_grad=True))
    assert args.add_bias_linear is False and args.layernorm_epsilon == 1e-6
    assert args.layernorm_zero_centered_gamma is True and args.check_for_nan_in_loss_and_grad is False
    assert parse_args(params(disable_bias_linear=False)).add_bias_linear is True  # flag absent: the default
    assert parse_args(params(add_bias_linear=False)).add_bias_linear is False  # the dest itself


def test_an_argument_given_twice_under_two_spellings_is_refused():
    message = error_of(norm_epsilon=1e-6, layernorm_epsilon=1e-5)
    assert "the same Megatron-LM argument as 'norm_epsilon' (--norm-epsilon)" in message


@pytest.mark.e2e
def test_schema_checks_need_no_engine_import():
    code = ("import sys; from primus.backends.megatron.arguments import parse_args; "
            "parse_args({'num_layers': 2, 'hidden_size': 64, 'num_attention_heads': 4, 'seq_length': 64, "
            "'train_iters': 2, 'lr': 1e-3, 'mock_data': True, 'micro_batch_size': 1, 'fp8': 'e4m3'}); "
            "print([m for m in ('torch', 'megatron', 'megatron.core') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- Megatron-LM's validate_args

def test_sequence_parallel_without_tensor_parallelism_is_turned_off_with_a_warning():
    args = parse_args(params(sequence_parallel=True))
    assert args.sequence_parallel is False
    assert [n for n in args.notes if n[0] == "sequence_parallel"][0][3] == "warning"
    assert parse_args(params(sequence_parallel=True, tensor_model_parallel_size=2)).sequence_parallel is True


def test_derived_defaults_as_megatron_lm():
    args = parse_args(params(swiglu=True))
    assert args.ffn_hidden_size == int((4 * 64 * 2 / 3) / 64) * 64 and args.kv_channels == 16
    assert parse_args(params()).ffn_hidden_size == 256
    assert parse_args(params()).query_groups == 4  # no group_query_attention: one group per head
    gqa = parse_args(params(group_query_attention=True, num_query_groups=2))
    assert gqa.query_groups == 2
    moe = parse_args(params(num_experts=4, tensor_model_parallel_size=2, sequence_parallel=True))
    assert moe.moe_ffn_hidden_size == 256 and moe.expert_tensor_parallel_size == 2
    assert parse_args(params(num_experts=0)).num_experts is None


def test_warmup_fraction_and_a_warmup_longer_than_the_run():
    assert parse_args(params(lr_warmup_fraction=0.1)).lr_warmup_fraction == 0.1
    assert "give one of lr_warmup_fraction and lr_warmup_iters" in error_of(lr_warmup_fraction=0.1, lr_warmup_iters=2)
    # AMD's blog experiment: 50 iterations, the preset's 200-iteration warm-up -> clamped, said once
    args = parse_args(params(train_iters=50, lr_warmup_iters=200))
    assert args.lr_warmup_iters == 49
    note = [n for n in args.notes if n[0] == "lr_warmup_iters"][0]
    assert note[3] == "warning" and "200" in note[2]
    assert parse_args(params(train_iters=50, lr_warmup_fraction=1.0)).lr_warmup_iters == 49


def test_split_data_arguments():
    args = parse_args(params(mock_data=False, tokenizer_type="HuggingFaceTokenizer", tokenizer_model="tok",
                             train_data_path=["a"], valid_data_path=["b"], test_data_path=None))
    assert args.train_data_path == ["a"] and args.split is None
    assert "give one data source" in error_of(train_data_path=["a"])  # with mock_data: true
    args = parse_args(params(mock_data=False, tokenizer_type="HuggingFaceTokenizer", tokenizer_model="tok",
                             data_path=["a"]))
    assert args.split == "969, 30, 1"  # Megatron-LM's legacy default, with a warning


@pytest.mark.parametrize("overrides, expected", [
    ({"batch_size": 4}, "batch_size: no longer valid in Megatron-LM, use micro_batch_size"),
    ({"micro_batch_size": None}, "micro_batch_size: is required"),
    ({"bf16": True, "fp16": True}, "bf16 and fp16 are both true"),
    ({"expert_model_parallel_size": 2}, "expert_model_parallel_size: expert_model_parallel_size > 1 needs num_experts"),
    ({"num_experts": 3, "expert_model_parallel_size": 2}, "num_experts (3) is not a multiple of expert_model_parallel_size (2)"),
    ({"num_experts": 4, "tensor_model_parallel_size": 2}, "sequence_parallel: MoE with tensor_model_parallel_size > 1 needs"),
    ({"max_position_embeddings": 32}, "max_position_embeddings (32) must be at least seq_length (64)"),
    ({"save": "/x"}, "save_interval: save is set"),
    ({"lr_decay_style": "WSD"}, "lr_wsd_decay_iters: lr_decay_style: WSD needs lr_wsd_decay_iters"),
    # Megatron-LM's FSDP asserts
    ({"use_torch_fsdp2": True, "gradient_accumulation_fusion": False},
     "untie_embeddings_and_output_weights: use_torch_fsdp2 requires untie_embeddings_and_output_weights: true"),
    ({"use_torch_fsdp2": True, "untie_embeddings_and_output_weights": True},
     "gradient_accumulation_fusion: use_torch_fsdp2 is not supported with gradient accumulation fusion"),
    ({"use_torch_fsdp2": True, "untie_embeddings_and_output_weights": True, "gradient_accumulation_fusion": False,
      "ckpt_format": "torch"}, "ckpt_format: use_torch_fsdp2 requires ckpt_format torch_dist or torch_dcp"),
    ({"use_megatron_fsdp": True}, "ckpt_format: Megatron FSDP only supports the fsdp_dtensor checkpoint format"),
    ({"ckpt_format": "fsdp_dtensor"}, "ckpt_format: fsdp_dtensor is only tested with Megatron FSDP"),
])
def test_megatron_lm_assertions_are_one_line(overrides, expected):
    assert expected in error_of(**overrides)


# ---------------------------------------------------------------- support classes

def test_every_argument_has_exactly_one_class():
    table = megatron_lm_table()
    lists = {"implemented": set(support.IMPLEMENTED), "kernel-only": set(support.KERNEL_ONLY),
             "refused": set(support.REFUSED)}
    for name, keys in lists.items():
        assert keys <= set(table), f"{name} lists unknown arguments: {keys - set(table)}"
    assert not lists["implemented"] & lists["kernel-only"]
    assert not lists["implemented"] & lists["refused"]
    assert not lists["kernel-only"] & lists["refused"]
    kinds = {dest: support.classify(dest).kind for dest in table}
    assert set(kinds.values()) == {"implemented", "kernel-only", "refused"}
    for kind, keys in lists.items():
        assert all(kinds[k] == kind for k in keys)
    assert sum(1 for k in kinds.values() if k == "implemented") == len(support.IMPLEMENTED)


def test_implemented_config_fields_exist_in_the_installed_megatron_core():
    pytest.importorskip("megatron.core")
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig  # noqa: F401
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config_fields = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    optimizer_fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    for dest, where in support.IMPLEMENTED.items():
        if where == "TransformerConfig":
            assert dest in config_fields, dest
        if where == "OptimizerConfig":
            assert dest in optimizer_fields, dest


# ---------------------------------------------------------------- recompute_num_layers: 0 (AMD's mixtral 8x22B)

def test_block_recompute_of_zero_layers_is_accepted_as_megatron_lm_does():
    # Megatron-LM's --recompute-num-layers is a plain int; megatron-core's block loop recomputes none of them
    args = parse_args(params(recompute_granularity="full", recompute_method="block", recompute_num_layers=0))
    assert args.recompute_num_layers == 0 and args.recompute_method == "block"


def test_uniform_recompute_of_zero_layers_is_one_line():
    # megatron-core's uniform loop advances by recompute_num_layers: 0 would never end
    message = error_of(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=0)
    assert message.startswith("modules.pre_trainer.recompute_num_layers: must be at least 1")
    assert "greater than or equal to 0" in error_of(recompute_granularity="full", recompute_method="block",
                                                    recompute_num_layers=-1)
