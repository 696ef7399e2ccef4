"""Every AMD Primus key the compatibility layer knows, and what it does here: nothing is dropped silently.

``MAPPED`` lists each key whose value changes something here (it becomes one of our settings, picks
a stage, is a kernel switch that runs the stock kernel, or is refused); adding such a key to a
table without listing it here fails ``test_every_mapped_key_is_listed``. The other keys of the
tables are ``inert`` (no effect here, with the reason) and are checked to do nothing but say so.
"""
import pytest

from primus.compat import TABLES, common
from primus.compat.rules import Rule
from primus.compat.translate import CompatContext, apply_rules
from primus.config.errors import ConfigError
from primus.config.provenance import Provenance

ALL = {"common": common.RULES, **TABLES}

SELECTIVE = {"activation_checkpoint": {"mode": "selective"}}  # what a key needs beside it
# key: (value as an AMD file writes it, what it does here[, the keys it needs beside it])
#   ("set", our key, our value) | ("stage", stage) | ("kernel",) | ("run",) refused when the run starts
#   | ("refuse", text in the one-line error) | ("keep", value left for the engine's own check)
#   | ("differs", our key, what runs): the file's value does not run, said in a differs: line
MAPPED = {
    "common": {
        "sink_level": ("WARNING", ("set", "@logging.level", "WARNING")),
        "stderr_sink_level": ("DEBUG", ("set", "@logging.level", "DEBUG")),
        "stage": ("sft", ("stage", "sft")),
    },
    "megatron": {
        # AMD Primus drops option spellings (its arg builder keeps dests only): what runs is the dest's value
        "norm_epsilon": (1e-6, ("differs", "layernorm_epsilon", 1e-5)),
        "apply_layernorm_1p": (True, ("differs", "layernorm_zero_centered_gamma", False)),
        "check_for_nan_in_loss": (False, ("set", "check_for_nan_in_loss_and_grad", False)),
        "activation_func": ("swiglu", ("set", "swiglu", True)),
        "fp4_recipe": ("mxfp4", ("run",)),
        "recompute_layer_ids": ("0,3,4", ("set", "recompute_num_layers", 1),
                                {"recompute_granularity": "full"}),
        "moe_token_dropping": (True, ("refuse", "gone from Megatron-LM")),
        "log_avg_skip_iterations": (2, ("set", "primus.avg_skip_steps", 2)),
        "log_avg_reset_interval": (50, ("set", "primus.avg_window", 50)),
        "disable_tensorboard": (True, ("set", "primus.tensorboard", False)),
        "disable_wandb": (True, ("set", "primus.wandb", False)),
        "disable_mlflow": (False, ("set", "primus.mlflow", True)),
        "mlflow_run_name": ("r", ("set", "primus.mlflow_run_name", "r")),
        "mlflow_experiment_name": ("e", ("set", "primus.mlflow_experiment_name", "e")),
        "auto_continue_train": (True, ("set", "primus.resume", "always")),
        "disable_last_saving": (True, ("set", "primus.save_last_checkpoint", False)),
        "sft_sanitize_nan_grads": (True, ("set", "primus.sanitize_nan_grads", True)),
        "fully_parallel_save": (False, ("set", "ckpt_fully_parallel_save", False)),
        "virtual_pipeline_model_parallel_size": (2, ("set", "num_virtual_stages_per_pipeline_rank", 2)),
        "tokenizer_type": ("Llama3Tokenizer", ("set", "tokenizer_type", "HuggingFaceTokenizer")),
        "sft_conversation_format": ("messages", ("set", "sft_conversation_format", "chat_template")),
        **{key: (True, ("kernel",)) for key in (
            "enable_primus_turbo", "use_turbo_autotune", "use_turbo_attention", "use_turbo_gemm",
            "use_turbo_grouped_gemm", "turbo_grouped_gemm_without_padding", "use_turbo_fused_act_with_probs",
            "moe_use_fused_router_with_aux_score", "use_turbo_deepep", "use_turbo_mega_moe", "use_turbo_rms_norm",
            "use_turbo_norm_te_linear", "moe_use_legacy_grouped_gemm", "no_fp8_weight_transpose_cache",
            "patch_zero_bubble", "patch_primus_pipeline", "pp_warmup", "patch_moe_overlap", "use_turbo_grouped_mlp",
            "use_turbo_permute_padding")},
        "turbo_gemm_backend": ("triton", ("kernel",)),
        "turbo_grouped_gemm_backend": ("triton", ("kernel",)),
        "turbo_sync_free_moe_stage": (2, ("kernel",)),
        "torch_compile": ({"enable": True, "backend": "inductor"}, ("kernel",)),
        **{key: (True, ("run",)) for key in (
            "enable_turbo_attention_float8", "mxfp4_gradient_stochastic_rounding",
            "weight_deosc", "enable_odc", "moe_extended_tp")},
        "use_sink_attention": (True, ("set", "softmax_type", "learnable")),
        "sink_sliding_window": (128, ("run",)),
        "decoder_pipeline_manual_split_list": ([8, 8, 8, 8], ("run",)),
        "data_parallel_replicate_degree": (2, ("run",)),
        "final_logit_softcapping": (30.0, ("run",)),
        "original_max_position_embeddings": (8192, ("run",)),
        "attn_logit_softcapping": (30.0, ("run",)),
        "router_logit_softcapping": (30.0, ("run",)),
        "use_deprecated_20241209_moe_layer": (True, ("refuse", "deprecated MoE layer")),
        "lora": ({"enabled": True, "dim": 16}, ("keep", {"enabled": True, "dim": 16})),
        "mock_dataset": ({"class": "x.FluxMock"}, ("refuse", "Flux/diffusion")),
        "model_type": ("mamba", ("refuse", "no Mamba/hybrid")),
    },
    "torchtitan": {
        "job.print_config": (True, ("set", "debug.print_config", True)),
        "job.print_args": (True, ("set", "debug.print_config", True)),
        "model.hf_assets_path": ("meta-llama/Llama-3.1-8B", ("set", "hf_assets_path", "meta-llama/Llama-3.1-8B")),
        "model.tokenizer_path": ("./tok", ("set", "hf_assets_path", "./tok")),
        "model.converters": (["primus_turbo", "quantize.linear.float8"],
                             ("set", "model.converters", {"float8": {"recipe_name": "tensorwise"}})),
        "training.dataset": ("c4", ("set", "dataloader.dataset", "c4")),
        "training.dataset_path": ("/data/c4", ("set", "dataloader.dataset_path", "/data/c4")),
        "training.mock_data": (True, ("set", "dataloader.dataset", "mock")),
        "training.compile": (True, ("set", "compile.enable", True)),
        "training.seed": (7, ("set", "debug.seed", 7)),
        "training.deterministic": (True, ("set", "debug.deterministic", True)),
        "optimizer.beta1": (0.8, ("set", "optimizer.betas", [0.8, 0.95])),
        "optimizer.beta2": (0.99, ("set", "optimizer.betas", [0.9, 0.99])),
        "optimizer.early_step_in_backward": (True, ("run",)),
        "activation_checkpoint.mode": ("full", ("keep", "full")),
        "activation_checkpoint.selective_ac_option": ("2", ("refuse", "layer-wise selective AC"), SELECTIVE),
        "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns":
            (["moe.router.gate"], ("set", "activation_checkpoint.force_recompute_mm_shapes_by_fqns",
                                   ["moe.router.gate"]), SELECTIVE),
        "profiling.*": (True, ("set", "profiler.enable_profiling", True)),
        "validation.enable": (True, ("set", "validator.enable", True)),
        "validation.freq": (5, ("set", "validator.freq", 5)),
        "validation.steps": (3, ("set", "validator.steps", 3)),
        "validation.dataset": ("c4_validation", ("set", "validator.dataloader.dataset", "c4_validation")),
        "validation.dataset_path": ("/v", ("set", "validator.dataloader.dataset_path", "/v")),
        "parallelism.enable_async_tensor_parallel": (True, ("set", "compile.enable_async_tensor_parallel", True)),
        "parallelism.expert_tensor_parallel_degree": (2, ("run",)),
        "fault_tolerance.enable": (True, ("run",)),
        "experimental.custom_import": ("my.module", ("refuse", "custom imports are not loaded")),
        "quantize.*": (["output"], ("note",)),
        "float8.*": (True, ("note",)),
        "mx.*": ("mxfp8", ("note",)),
        "primus_turbo.*": (True, ("kernel",)),
    },
    "nemo_automodel": {
        "model.mode": ("finetune", ("stage", "finetune")),
        "optim.learning_rate": (5e-6, ("set", "optimizer.lr", 5e-6)),
        "optim.optimizer.*": (0.01, ("set", "optimizer.weight_decay", 0.01)),
        "optim.clip_grad": (1.0, ("set", "clip_grad_norm.max_norm", 1.0)),
        "step_scheduler.log_every": (2, ("set", "step_scheduler.log_remote_every_steps", 2)),
        "wandb.enable": (False, ("drops", "wandb")),
        # AutoModel's own key; in AMD Primus's format a checkpoint to be written elsewhere is said
        "checkpoint.checkpoint_dir": ("/checkpoints/x", ("differs", "checkpoint.checkpoint_dir", "{run dir}/checkpoints")),
    },
}
# Keys of model families Primus's Megatron backend does not build: any value is refused at resolve.
FAMILIES = ("DeepSeek-V4", "Kimi-K3", "Mamba / hybrid", "LFM2", "Flux / diffusion")


def _nest(key: str, value):
    *parents, leaf = key.replace(".*", ".enable_profiling" if key == "profiling.*" else
                                 ".weight_decay" if key == "optim.optimizer.*" else ".x").split(".")
    tree = {leaf: value}
    for part in reversed(parents):
        tree = {part: tree}
    return tree


def translate(framework: str, key: str, value, beside=None):
    params = _nest(key, value)
    for name, given in (beside or {}).items():  # a section's keys, or a flat key
        if isinstance(given, dict):
            params.setdefault(name, {}).update(given)
        else:
            params[name] = given
    ctx = CompatContext("pre_trainer", framework, params, "pretrain", False, {"logging": {}}, Provenance(),
                        amd_format=True)  # each key as an AMD Primus file has it
    rules = ALL[framework] if framework == "common" else {**common.RULES, **ALL[framework]}
    apply_rules(ctx, rules)
    return ctx


def _get(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_mapped_key_is_listed():
    for framework, rules in ALL.items():
        mapped = {k for k, r in rules.items() if r.action != "inert" and not _family(r)}
        assert mapped == set(MAPPED[framework]), framework


def _family(rule: Rule) -> bool:
    return rule.action == "unsupported" and rule.when == "resolve" and any(f in rule.why for f in FAMILIES)


@pytest.mark.parametrize("framework, key", [(f, k) for f, keys in MAPPED.items() for k in keys])
def test_what_each_mapped_key_does_here(framework, key):
    value, (effect, *detail), *beside = MAPPED[framework][key]
    beside = beside[0] if beside else None
    if effect == "refuse":
        with pytest.raises(ConfigError, match=detail[0].replace("(", r"\(")):
            translate(framework, key, value, beside)
        return
    ctx = translate(framework, key, value, beside)
    lines = [t for t in ctx.translations if t.source.startswith(key.rstrip("*").rstrip("."))]
    line = next((t for t in lines if effect == "set" and t.target == detail[0].lstrip("@")), None) \
        or (lines[0] if lines else None)
    if effect == "set":
        target, expected = detail
        tree = ctx.experiment if target.startswith("@") else ctx.params
        assert _get(tree, target.lstrip("@")) == expected
        assert line.kind == "rename" and line.target_value == expected
    elif effect == "stage":
        assert ctx.stage == detail[0] and line.kind == "stage"
    elif effect == "differs":
        target, runs = detail
        assert line.kind == "differs" and line.target == target and line.target_value == runs
        assert line.line().startswith(f"differs: {key}=") and f"→ {target}={runs!s}".lower() in line.line().lower()
        assert _get(ctx.params, target) if target in ctx.params else True
        assert key == target or key not in ctx.params  # the file's value never reaches the engine
        return
    elif effect == "keep":
        assert _get(ctx.params, key) == detail[0] and line is None  # ours too: the engine checks it
    elif effect == "drops":
        assert detail[0] not in ctx.params and line.kind == "inert"
    elif effect == "note":
        assert line.kind == "inert" and not ctx.params
    else:
        assert line.kind == {"kernel": "kernel", "run": "refuse_at_run"}[effect]
    if line is not None:
        assert line.line().startswith(f"translated {line.source}=")
        if line.target != line.source:  # the AMD name never reaches an engine
            with pytest.raises((KeyError, TypeError)):
                _get(ctx.params, line.source)


@pytest.mark.parametrize("framework, key", [(f, k) for f, rules in ALL.items() for k, r in rules.items()
                                            if r.action in ("kernel", "unsupported") and not _family(r)])
def test_a_switch_left_off_does_nothing_but_say_so(framework, key):
    rule = ALL[framework][key]
    ctx = translate(framework, key, rule.off[0] if rule.off else False)
    assert [t.kind for t in ctx.translations] == ["inert"] and not ctx.params


@pytest.mark.parametrize("framework, key", [(f, k) for f, rules in ALL.items() for k, r in rules.items()
                                            if r.action == "inert"])
def test_inert_keys_have_no_effect_and_say_why(framework, key):
    rule = ALL[framework][key]
    assert len(rule.why) > 10
    ctx = translate(framework, key, "some value")
    assert not ctx.params and [t.kind for t in ctx.translations] == ["inert"]
    assert ctx.translations[0].line().endswith(f"→ no effect ({rule.why})")


@pytest.mark.parametrize("key", [k for k, r in TABLES["megatron"].items() if _family(r)])
def test_model_family_keys_are_refused_by_name(key):
    with pytest.raises(ConfigError, match=rf"modules.pre_trainer.{key}: AMD Primus option not supported here: "):
        translate("megatron", key, 1)


def test_stage_mlperf_pretrain_plans_as_pretraining_and_admission_refuses_it():
    """AMD's MLPerf examples name a trainer from an optional package (primus_mllog): the plan is the
    pretraining it is; admission (validate, plan, dry-run and the launch alike) refuses it in one line on
    any device, before any rank starts."""
    from primus.plan.target import Target, named_target
    from primus.runtime.admission import admit

    ctx = translate("megatron", "stage", "mlperf_pretrain")
    assert ctx.stage == "pretrain"
    assert [t.kind for t in ctx.translations] == ["stage", "refuse_at_run"]
    adapter = type("Adapter", (), {"admit": lambda self, plan, target: []})()
    plan = type("Plan", (), {"module": type("Module", (), {"name": "pre_trainer", "params": {}})})()
    for target in (Target("cpu"), named_target("mi355x")):
        with pytest.raises(ConfigError, match=r"modules.pre_trainer.stage: 'mlperf_pretrain': .*primus_mllog.*"
                                              r"stage: pretrain runs the same training"):
            admit(adapter, plan, target, ctx.translations).check()


_TINY_MEGATRON = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
                  "micro_batch_size": 1, "mock_data": True, "train_iters": 4, "lr": 1e-3}


def test_an_environment_variable_among_the_settings_is_said_to_have_no_effect():
    """AMD's deepseek_v2_lite SFT file lists HSA_NO_SCRATCH_RECLAIM: 1 (and others) in its overrides."""
    ctx = translate("megatron", "HSA_NO_SCRATCH_RECLAIM", 1)
    (line,) = ctx.translations
    assert line.kind == "inert" and "environment variable" in line.line() and not ctx.params
    with pytest.raises(ConfigError, match="unknown Megatron argument"):  # lower case is a setting: checked
        from primus.backends.megatron.arguments import parse_args

        parse_args({"hsa_no_scratch_reclaim": 1, **_TINY_MEGATRON})


def test_null_for_an_argument_megatron_lm_never_leaves_unset_keeps_its_default():
    """AMD's bridge-aligned SFT files: moe_flex_dispatcher_backend: null (argparse cannot say null)."""
    from primus.backends.megatron.arguments import parse_args

    args = parse_args({"moe_flex_dispatcher_backend": None, **_TINY_MEGATRON})
    assert args.moe_flex_dispatcher_backend == "deepep" and "moe_flex_dispatcher_backend" not in args.given
    assert any(key == "moe_flex_dispatcher_backend" and "null" in why for key, _, why, _ in args.notes)


@pytest.mark.parametrize("converters, quantize, expected", [
    # TorchTitan 0.2 built torchao's tensorwise config when no recipe was named (and honoured emulate only then)
    (["quantize.linear.float8"], {"recipe_name": None, "emulate": True, "enable_fsdp_float8_all_gather": False},
     ("set", {"float8": {"recipe_name": "tensorwise", "emulate": True}})),
    (["quantize.linear.float8"], {"recipe_name": "rowwise", "filter_fqns": ["output"], "emulate": True},
     ("set", {"float8": {"recipe_name": "rowwise", "filter_fqns": ["lm_head"]}})),  # 0.3.0's name for output
    # AMD's FP8 examples: our -fp8 preset's converter, their quantize.linear.float8 settings applied to it
    ({"float8": {"recipe_name": "tensorwise"}}, {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["output"]},
     ("set", {"float8": {"recipe_name": "tensorwise", "filter_fqns": ["lm_head"]}})),
    (["primus_turbo"], {}, ("kernel", None)),
    (["quantize.linear.mx"], {}, ("refuse_at_run", None)),
    ({"float8": {"recipe_name": "rowwise"}}, {}, ("ours", {"float8": {"recipe_name": "rowwise"}})),
])
def test_model_converters_become_torchtitan_0_3_converter_settings(converters, quantize, expected):
    ctx = translate("torchtitan", "model.converters", converters,
                    {"quantize": {"linear": {"float8": quantize}}} if quantize else None)
    kind, value = expected
    lines = [t for t in ctx.translations if t.source == "model.converters"]
    if kind == "ours":  # Primus's own spelling: left for the backend, no translation said
        assert ctx.params["model"]["converters"] == value and not lines
        return
    assert lines[0].kind == ("rename" if kind == "set" else kind)
    if kind == "set":
        assert ctx.params["model"]["converters"] == value
    else:
        assert "converters" not in ctx.params.get("model", {})


def test_the_option_spellings_defaults_are_megatron_lms():
    from primus.backends.megatron.schema import megatron_lm_table
    from primus.compat.megatron import OPTION_DEFAULTS

    assert OPTION_DEFAULTS == {dest: megatron_lm_table()[dest].default for dest in OPTION_DEFAULTS}


def test_a_primus_automodel_checkpoint_dir_is_kept_and_not_a_difference():
    """Primus's own experiments may set checkpoint.checkpoint_dir: kept for the backend (its derived line), no
    differs: line; nor in AMD Primus's format with checkpoints off (nothing is written)."""
    ctx = CompatContext("pre_trainer", "nemo_automodel", {"checkpoint": {"checkpoint_dir": "/c"}}, "pretrain", False,
                        {"logging": {}}, Provenance(), amd_format=False)
    apply_rules(ctx, {**common.RULES, **ALL["nemo_automodel"]})
    assert ctx.params == {"checkpoint": {"checkpoint_dir": "/c"}} and ctx.translations == []
    ctx = translate("nemo_automodel", "checkpoint.checkpoint_dir", "/c", {"checkpoint": {"enabled": False}})
    assert ctx.params["checkpoint"]["checkpoint_dir"] == "/c" and ctx.translations == []
