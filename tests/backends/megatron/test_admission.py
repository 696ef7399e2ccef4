"""Admission of Megatron-LM arguments per target (primus/backends/megatron/admission.py): refused here,
admitted there, said in one line, never silently dropped."""
from __future__ import annotations

import pytest

from primus.backends.megatron.admission import FEATURES, SWITCHES, VALUE_FEATURES, check_arguments
from primus.backends.megatron.arguments import parse_args
from primus.config.errors import ConfigError
from primus.plan.target import Target, named_target
from primus.runtime.admission import Admission
from primus.runtime.capabilities import CAPABILITIES

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "train_iters": 10,
        "lr": 1e-3, "mock_data": True, "vocab_size": 512, "micro_batch_size": 1}
CPU = Target("cpu")
MI300X = named_target("mi300x")
GPU_WITHOUT_TE = Target("cuda", (9, 0), "h100")  # present, Transformer Engine not importable


def refusals(target, **overrides):
    found, _ = check_arguments(parse_args({**TINY, **overrides}), target)
    return {r.key: r.message for r in found}


def notes(target, **overrides):
    return {key: reason for key, _, reason in check_arguments(parse_args({**TINY, **overrides}), target)[1]}


def test_every_feature_row_exists_and_every_switch_belongs_to_its_row():
    assert set(FEATURES.values()) | set(VALUE_FEATURES.values()) <= set(CAPABILITIES)
    assert all(FEATURES[switch] == row for row, switch in SWITCHES.items())


def test_a_refused_argument_is_one_line_naming_the_key_the_target_and_the_default():
    found = refusals(CPU, fp4="e2m1")
    assert list(found) == ["fp4"]
    assert found["fp4"].startswith("'e2m1' cannot be honoured on cpu (FP4 training through Transformer Engine")
    assert found["fp4"].endswith("(remove it or set it to Megatron-LM's default, None)")
    error = Admission(CPU, "pre_trainer", check_arguments(parse_args({**TINY, "fp4": "e2m1"}), CPU)[0]).error()
    assert "\n" not in error and error.startswith("modules.pre_trainer.fp4: 'e2m1' cannot be honoured on cpu")


def test_every_refusal_is_listed_and_the_line_names_the_others():
    args = parse_args({**TINY, "fp8": "hybrid", "fp8_recipe": "tensorwise", "rampup_batch_size": None,
                       "use_legacy_models": True})
    found, _ = check_arguments(args, CPU)
    assert {r.key for r in found} == {"fp8", "use_legacy_models"}  # FP8's first refusal speaks for its recipe
    assert Admission(CPU, "pre_trainer", found).error().endswith("(also refused on cpu: use_legacy_models)")
    with pytest.raises(ConfigError):
        Admission(CPU, "pre_trainer", found).check()


def test_an_unsupported_value_of_an_implemented_argument_is_refused_everywhere():
    for target in (CPU, MI300X):
        assert refusals(target, optimizer="muon")["optimizer"].startswith(f"'muon' cannot be run on {target.name}")


def test_the_precision_aware_optimizer_needs_transformer_engine_on_a_gpu():
    settings = dict(use_precision_aware_optimizer=True, use_distributed_optimizer=True, main_grads_dtype="bf16",
                    exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert set(refusals(CPU, **settings)) == {"use_precision_aware_optimizer", "main_grads_dtype", "exp_avg_dtype",
                                               "exp_avg_sq_dtype"}
    assert "target cpu is a CPU" in refusals(CPU, **settings)["use_precision_aware_optimizer"]
    assert "Transformer Engine, which is not importable" in refusals(GPU_WITHOUT_TE, **settings)["main_grads_dtype"]
    assert refusals(MI300X, **settings) == {}  # a named GPU: its training image's Transformer Engine assumed


def test_a_features_settings_without_its_switch_have_no_effect_and_are_said():
    assert refusals(CPU, fp8_amax_history_len=1024, fp8_param_gather=True) == {}
    assert notes(CPU, fp8_amax_history_len=1024)["fp8_amax_history_len"] == \
        "accepted, no effect here: read only with fp8"  # te_features.inert_notes
    said = notes(CPU, torch_fsdp2_reshard_after_forward=False)
    assert said["torch_fsdp2_reshard_after_forward"] == "no effect without use_torch_fsdp2 (Megatron-LM reads it only then)"


def test_ckpt_format_is_irrelevant_without_save_load_or_pretrained_checkpoint(monkeypatch):
    from primus.runtime import capabilities

    assert "no checkpoint in this format is written or read" in notes(CPU, ckpt_format="torch")["ckpt_format"]
    monkeypatch.setitem(capabilities.CAPABILITIES, "megatron.ckpt_format.torch",
                        capabilities.Capability(capabilities.NOWHERE, "the legacy layout"))
    assert refusals(CPU, ckpt_format="torch") == {}  # save / load null: never refused, whatever the row says
    found = refusals(MI300X, ckpt_format="torch", save="/ckpt", save_interval=10)
    assert found["ckpt_format"].startswith("'torch' cannot be run on mi300x (the legacy layout")


def test_legacy_checkpoints_are_admitted_with_or_without_save_and_load():
    """AMD's files set ckpt_format: torch with save/load null; the legacy layout is wired: admitted either way."""
    for paths in ({"save": None, "load": None}, {"save": "/ckpt", "save_interval": 10, "load": "/ckpt"}):
        for target in (CPU, MI300X):
            assert refusals(target, ckpt_format="torch", **paths) == {}


def test_megatron_fsdp_needs_a_gpu_and_torch_fsdp2_runs_anywhere():
    megatron_fsdp = dict(use_megatron_fsdp=True, ckpt_format="fsdp_dtensor",
                         data_parallel_sharding_strategy="optim_grads_params")
    found = refusals(CPU, **megatron_fsdp)
    assert set(found) == {"use_megatron_fsdp", "data_parallel_sharding_strategy"}
    assert "Megatron FSDP (use_megatron_fsdp, megatron-core's megatron_fsdp) needs a GPU; target cpu is a CPU" in \
        found["use_megatron_fsdp"]
    assert refusals(MI300X, **megatron_fsdp) == {} and refusals(GPU_WITHOUT_TE, **megatron_fsdp) == {}
    fsdp2 = dict(use_torch_fsdp2=True, untie_embeddings_and_output_weights=True, gradient_accumulation_fusion=False,
                 torch_fsdp2_reshard_after_forward=False)
    assert refusals(CPU, **fsdp2) == {}


def test_flipping_one_row_decides_the_feature(monkeypatch):
    """FP8's row (GPU with Transformer Engine) decides before its recipes do: set to NOWHERE, no GPU runs it."""
    from primus.runtime import capabilities

    assert refusals(MI300X, fp8="hybrid", fp8_recipe="tensorwise") == {}
    assert "fp8" in refusals(CPU, fp8="hybrid") and "fp8" in refusals(GPU_WITHOUT_TE, fp8="hybrid")
    monkeypatch.setitem(capabilities.CAPABILITIES, "megatron.fp8",
                        capabilities.Capability(capabilities.NOWHERE, "FP8 training through Transformer Engine"))
    assert "not wired in Primus" in refusals(MI300X, fp8="hybrid", fp8_recipe="tensorwise")["fp8"]


def test_arguments_wired_for_amd_files_are_admitted_on_a_cpu():
    assert refusals(CPU, enable_experimental=True, dataloader_type="cyclic", pretrained_checkpoint="/base",
                    calculate_per_token_loss=True, exit_duration_in_mins=10) == {}
    assert refusals(CPU, train_iters=None, train_samples=100, global_batch_size=4, lr_warmup_samples=8) == {}


def test_kernel_only_arguments_are_said_never_silent():
    said = notes(CPU, use_flash_attn=True, overlap_p2p_comm=False, wandb_project="x", async_save=True)
    assert set(said) == {"use_flash_attn", "overlap_p2p_comm", "wandb_project"}  # async_save is honoured (saving.py)
    assert all(reason.startswith("accepted, no effect here: ") for reason in said.values())
    assert notes(CPU, use_flash_attn=False) == {}  # Megatron-LM's default says nothing
