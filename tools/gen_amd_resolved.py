#!/usr/bin/env python3
"""Generate the tables of what AMD Primus resolves for each of its Megatron and TorchTitan example files, key by key.

For every ``examples/megatron/configs/MI*/*.yaml`` of AMD Primus at the commit below it does what AMD
Primus's ``PrimusParser`` does, read from its files (not from Primus's copies):

1. the experiment file, ``${VAR:default}`` read with VAR unset, ``extends:`` parents merged first;
2. the module preset (``config:``) and the model preset (``model:``), each with its ``extends:``/``bases:``
   chain (parents first, later wins; ``deep_merge``);
3. ``merge_namespace(module_config, model_config, allow_override=False)``: a key the module preset has
   wins over the model preset's;
4. the experiment's ``overrides`` deep-merged last;
5. only Megatron-LM d3528a2's argument dests reach Megatron-LM (``MegatronArgBuilder``); an unset one
   is Megatron-LM's default; then Megatron-LM's own ``validate_args`` derivations (``megatron_lm_rules``).

The table keeps ``COMPARED`` (the network, the optimiser, the batch, the run length, evaluation,
timeouts, parallelism and data source) for each file: ``tests/compat/amd_resolved.json``.
``tests/compat/test_amd_resolved.py`` compares Primus's resolved Megatron arguments with it.

For every ``examples/torchtitan/configs/MI*/*.yaml`` the same merge (1-4) gives the TorchTitan 0.2 settings
AMD Primus hands its trainer; the table keeps ``TORCHTITAN_COMPARED`` (the model, the optimiser and its
schedule, the batch, the run length, compile, activation checkpointing, the data trained on, the layout)
for each file: ``tests/compat/amd_resolved_torchtitan.json``, compared by
``tests/compat/test_amd_resolved_torchtitan.py``. Two columns are what AMD Primus's code makes of a pair
of keys: ``data`` is ``mock`` when ``training.mock_data`` is true (its ``mock_hf_dataset`` patch replaces
``datasets.load_dataset`` whatever ``training.dataset`` names), else ``training.dataset``;
``activation_checkpoint`` is the mode, with ``selective_ac_option`` beside ``selective`` (``op``: per-op;
a number: every n-th layer).

For every ``examples/nemo_automodel/configs/MI*/**/*.yaml`` (AMD Primus's Wan 2.2 A14B files) the same merge
(1-4) gives the tree AMD Primus hands NeMo AutoModel (its ``strip_primus_keys``, then AutoModel's own loader,
whose ``ConfigNode`` reads ``5e-5`` as a number); the table keeps ``AUTOMODEL_COMPARED`` in AMD's names, as
AutoModel at the commit AMD Primus pins (``third_party/Automodel``, named in the table) reads them: the
model and the expert trained, the optimiser and its schedule, batch and length, the data loader, flow matching,
the layout, precision, recomputation and compile, the run's switches. ``wandb`` is whether a W&B run starts
(AutoModel drops the block on ``wandb.enable: false``); ``model.pipeline_spec.*`` is null in finetune mode,
where AutoModel loads pretrained weights and does not read it. ``tests/compat/amd_resolved_automodel.json``,
compared by ``tests/compat/test_amd_resolved_automodel.py``.

    python tools/gen_amd_resolved.py [--framework megatron|torchtitan|nemo_automodel] [--git-dir AMD_PRIMUS_GIT_DIR]
                                     [--commit fd1eeab] [--check]
"""
from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE_REPO = "AMD-AGI/Primus"
SOURCE_COMMIT = "fd1eeabbad15135e3702094087e96142b4b4eacb"
DEFAULT_GIT_DIR = os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo")
OUT = REPO / "tests" / "compat" / "amd_resolved.json"
TORCHTITAN_OUT = REPO / "tests" / "compat" / "amd_resolved_torchtitan.json"
EXAMPLES = re.compile(r"^examples/megatron/configs/MI[0-9A-Z]+/[^/]+\.yaml$")
TORCHTITAN_EXAMPLES = re.compile(r"^examples/torchtitan/configs/MI[0-9A-Z]+/[^/]+\.yaml$")
CONFIGS = "primus/configs"
COMPARED = (
    # the network
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "normalization", "layernorm_epsilon", "qk_layernorm", "add_qkv_bias",
    "add_bias_linear", "swiglu", "untie_embeddings_and_output_weights", "position_embedding_type", "rotary_base",
    "use_rope_scaling", "rope_scaling_factor", "num_experts", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_router_topk", "mtp_num_layers", "multi_latent_attention",
    # optimiser and schedule
    "lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "weight_decay", "adam_beta1", "adam_beta2", "clip_grad",
    # batch, length, evaluation, timeouts
    "micro_batch_size", "global_batch_size", "seq_length", "train_iters", "eval_iters", "eval_interval",
    "distributed_timeout_minutes",
    # parallelism, precision, data source
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
    "sequence_parallel", "pipeline_model_parallel_layout", "bf16", "mock_data", "dataloader_type",
)
TORCHTITAN_COMPARED = (
    # the model (a registry name and flavor)
    "model.name", "model.flavor",
    # optimiser and schedule
    "optimizer.name", "optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "optimizer.beta1", "optimizer.beta2",
    "lr_scheduler.warmup_steps", "lr_scheduler.decay_ratio", "lr_scheduler.decay_type", "lr_scheduler.min_lr_factor",
    # batch, length, precision, compile, recomputation, data
    "training.local_batch_size", "training.global_batch_size", "training.seq_len", "training.steps",
    "training.max_norm", "training.mixed_precision_param", "compile.enable", "activation_checkpoint", "data",
    # layout, checkpoints
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree", "checkpoint.enable",
)
AUTOMODEL_OUT = REPO / "tests" / "compat" / "amd_resolved_automodel.json"
AUTOMODEL_EXAMPLES = re.compile(r"^examples/nemo_automodel/configs/MI[0-9A-Z]+/.+\.yaml$")
AUTOMODEL_COMPARED = (
    # the model and the expert trained
    "model.pretrained_model_name_or_path", "model.mode", "model.stage", "model.boundary_ratio",
    "model.attention_backend", "model.torch_dtype", "model.compute_dtype", "model.pipeline_spec.transformer_cls",
    "model.pipeline_spec.subfolder",
    # optimiser and schedule
    "optim.learning_rate", "optim.optimizer._target_", "optim.optimizer.weight_decay", "optim.optimizer.betas",
    "optim.optimizer.foreach", "optim.optimizer.fused", "lr_scheduler.lr_decay_style", "lr_scheduler.lr_warmup_steps",
    "lr_scheduler.min_lr",
    # batch and length
    "step_scheduler.global_batch_size", "step_scheduler.local_batch_size", "step_scheduler.max_steps",
    "step_scheduler.num_epochs", "step_scheduler.ckpt_every_steps",
    # the data loader
    "data.dataloader._target_", "data.dataloader.cache_dir", "data.dataloader.model_type",
    "data.dataloader.base_resolution", "data.dataloader.dynamic_batch_size", "data.dataloader.shuffle",
    "data.dataloader.drop_last", "data.dataloader.num_workers",
    # flow matching
    "flow_matching.adapter_type", "flow_matching.timestep_sampling", "flow_matching.logit_mean",
    "flow_matching.logit_std", "flow_matching.flow_shift", "flow_matching.mix_uniform_ratio",
    "flow_matching.num_train_timesteps", "flow_matching.i2v_prob", "flow_matching.use_loss_weighting",
    # layout, precision, recomputation, compile
    "fsdp.tp_size", "fsdp.cp_size", "fsdp.pp_size", "fsdp.dp_replicate_size", "fsdp.activation_checkpointing",
    "fsdp.reduce_dtype", "fsdp.enable_compile", "fsdp.defer_fsdp_grad_sync", "fsdp.enable_fsdp2_prefetch",
    "fsdp.fsdp2_forward_prefetch_depth", "fsdp.fsdp2_backward_prefetch_depth",
    # the run
    "seed", "dist_env.timeout_minutes", "performance.check_loss", "performance.grad_clip_foreach",
    "checkpoint.enabled", "checkpoint.checkpoint_dir", "checkpoint.model_save_format", "checkpoint.save_consolidated",
    "checkpoint.diffusers_compatible", "checkpoint.restore_from", "wandb",
)
_ENV = re.compile(r"\$\{([^:{}]+)(?::([^}]*))?}")


@functools.lru_cache(maxsize=None)
def git(git_dir: str, *argv: str) -> str:
    result = subprocess.run(["git", "--git-dir", git_dir, *argv], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"gen_amd_resolved: git {' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def _env(value: Any) -> Any:
    """``${VAR:default}`` as AMD Primus reads it with VAR unset (its default, typed as YAML reads it)."""
    if isinstance(value, dict):
        return {k: _env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_env(v) for v in value]
    if isinstance(value, str) and _ENV.fullmatch(value.strip()):
        return yaml.safe_load(_ENV.fullmatch(value.strip()).group(2) or "null")
    if isinstance(value, str):  # a reference inside a string: ${PRIMUS_MODEL:deepseek_v3}.yaml
        return _ENV.sub(lambda match: match.group(2) or "", value)
    return value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = deep_merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def load(git_dir: str, commit: str, path: str) -> dict[str, Any]:
    """A file with its ``extends:``/``bases:`` parents (relative to it), parents first, the file last."""
    data = _env(yaml.safe_load(git(git_dir, "show", f"{commit}:{path}")) or {})
    parents = data.pop("extends", None) or data.pop("bases", None) or []
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = deep_merge(merged, load(git_dir, commit, posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                                                            parent))))
    return deep_merge(merged, data)


def resolve(git_dir: str, commit: str, path: str) -> dict[str, dict[str, Any]]:
    """{module name: the Megatron-LM arguments AMD Primus hands Megatron-LM, COMPARED only}."""
    from primus.backends.megatron.schema import megatron_lm_table

    table = megatron_lm_table()
    out = {}
    for name, merged in amd_modules(git_dir, commit, path, "megatron"):
        args = {key: merged[key] if key in merged and merged[key] is not None else _default(table, key)
                for key in COMPARED}
        out[name] = megatron_lm_rules(args)
    return out


def amd_modules(git_dir: str, commit: str, path: str, framework: str):
    """(module name, settings) of each ``framework`` module of an AMD example, merged as AMD Primus merges:
    its module preset over its model preset (``merge_namespace``, no override), then the overrides."""
    for name, module in (load(git_dir, commit, path).get("modules") or {}).items():
        if not isinstance(module, dict) or module.get("framework") != framework:
            continue
        config = load(git_dir, commit, f"{CONFIGS}/modules/{framework}/{module['config']}")
        model = load(git_dir, commit, f"{CONFIGS}/models/{framework}/{module['model']}")
        merged = {**{k: v for k, v in model.items() if k not in config}, **config}
        yield name, deep_merge(merged, module.get("overrides") or {})


def setting(settings: dict[str, Any], dotted: str, path: str) -> Any:
    """A dotted setting of a merged AMD module; AMD's presets set every compared column, so an absent one
    means the generator no longer reads AMD's files as they are."""
    node: Any = settings
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SystemExit(f"gen_amd_resolved: {path}: {dotted} is not set")
        node = node[part]
    return node


def resolve_torchtitan(git_dir: str, commit: str, path: str) -> dict[str, dict[str, Any]]:
    """{module name: the TorchTitan 0.2 settings AMD Primus's trainer reads, TORCHTITAN_COMPARED only}."""
    return {name: {key: torchtitan_value(merged, key, path) for key in TORCHTITAN_COMPARED}
            for name, merged in amd_modules(git_dir, commit, path, "torchtitan")}


def torchtitan_value(settings: dict[str, Any], key: str, path: str) -> Any:
    """One column: a setting, or what AMD Primus's code makes of two (``data``, ``activation_checkpoint``)."""
    def at(dotted: str) -> Any:
        return setting(settings, dotted, path)

    if key == "data":  # primus/backends/torchtitan/patches/mock_dataset_patches.py
        return "mock" if at("training.mock_data") else at("training.dataset")
    if key == "activation_checkpoint":
        mode = at("activation_checkpoint.mode")
        return f"selective({at('activation_checkpoint.selective_ac_option')})" if mode == "selective" else mode
    return at(key)


def resolve_automodel(git_dir: str, commit: str, path: str) -> dict[str, dict[str, Any]]:
    """{module name: the AutoModel settings AMD Primus hands AutoModel, AUTOMODEL_COMPARED only}."""
    return {name: {key: automodel_value(merged, key, path) for key in AUTOMODEL_COMPARED}
            for name, merged in amd_modules(git_dir, commit, path, "nemo_automodel")}


def automodel_value(settings: dict[str, Any], key: str, path: str) -> Any:
    """One column, as AutoModel's loader reads it (``translate_value``: ``5e-5`` is a float)."""
    def at(dotted: str) -> Any:
        return _as_read(setting(settings, dotted, path))

    if key == "wandb":  # _arg_parser._resolve_wandb_enable: the block is dropped on enable: false
        block = settings.get("wandb")
        return isinstance(block, dict) and block.get("enable", True) is not False
    if key.startswith("model.pipeline_spec.") and str(at("model.mode")).lower() == "finetune":
        return None  # build_diffusion_pipeline reads pipeline_spec only to build a random-init expert
    return at(key)


def _as_read(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_read(v) for v in value]
    if isinstance(value, str):
        try:
            read = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
        return read if isinstance(read, (int, float)) and not isinstance(read, bool) else value
    return value


def megatron_lm_rules(args: dict[str, Any]) -> dict[str, Any]:
    """The values Megatron-LM d3528a2's ``validate_args`` (megatron/training/arguments.py) derives among
    ``COMPARED``: an unset FFN width, head width or expert width, sequence parallelism at TP 1."""
    if args["ffn_hidden_size"] is None and args["hidden_size"]:  # arguments.py:1040
        hidden = args["hidden_size"]
        args["ffn_hidden_size"] = int((4 * hidden * 2 / 3) / 64) * 64 if args["swiglu"] else 4 * hidden
    if args["kv_channels"] is None and args["hidden_size"] and args["num_attention_heads"]:  # arguments.py:1051
        args["kv_channels"] = args["hidden_size"] // args["num_attention_heads"]
    if args["tensor_model_parallel_size"] == 1:  # arguments.py:1145
        args["sequence_parallel"] = False
    if args["num_experts"] is not None and args["moe_ffn_hidden_size"] is None:  # arguments.py:1254
        args["moe_ffn_hidden_size"] = args["ffn_hidden_size"]
    return args


def _default(table, key: str) -> Any:
    default = table[key].default
    return list(default) if isinstance(default, tuple) else default


def generate(git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT) -> dict[str, Any]:
    commit = git(git_dir, "rev-parse", commit).strip()
    files = sorted(p for p in git(git_dir, "ls-tree", "-r", "--name-only", commit, "examples/megatron").split()
                   if EXAMPLES.match(p))
    rows = {}
    for path in files:
        try:
            modules = resolve(git_dir, commit, path)
        except SystemExit:  # a preset AMD Primus's own file names but its tree lacks: AMD Primus fails too
            continue
        for name, args in modules.items():
            rows[f"{path}:{name}"] = [args[key] for key in COMPARED]
    return {"source": f"{SOURCE_REPO}@{commit}", "megatron_lm": "NVIDIA/Megatron-LM@d3528a2",
            "generator": "tools/gen_amd_resolved.py", "keys": list(COMPARED), "rows": rows}


def _rows(git_dir: str, commit: str, folder: str, pattern, resolver, keys) -> dict[str, list]:
    """{"path:module": the compared values in ``keys`` order} for AMD's example files under ``folder``."""
    files = sorted(p for p in git(git_dir, "ls-tree", "-r", "--name-only", commit, folder).split() if pattern.match(p))
    return {f"{path}:{name}": [values[key] for key in keys]
            for path in files for name, values in resolver(git_dir, commit, path).items()}


def generate_torchtitan(git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT) -> dict[str, Any]:
    commit = git(git_dir, "rev-parse", commit).strip()
    rows = _rows(git_dir, commit, "examples/torchtitan", TORCHTITAN_EXAMPLES, resolve_torchtitan, TORCHTITAN_COMPARED)
    return {"source": f"{SOURCE_REPO}@{commit}", "torchtitan": "TorchTitan 0.2 settings (AMD Primus's names)",
            "generator": "tools/gen_amd_resolved.py", "keys": list(TORCHTITAN_COMPARED), "rows": rows}


def generate_automodel(git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT) -> dict[str, Any]:
    commit = git(git_dir, "rev-parse", commit).strip()
    pinned = git(git_dir, "ls-tree", commit, "third_party/Automodel").split()[2]
    rows = _rows(git_dir, commit, "examples/nemo_automodel", AUTOMODEL_EXAMPLES, resolve_automodel, AUTOMODEL_COMPARED)
    return {"source": f"{SOURCE_REPO}@{commit}", "automodel": f"NVIDIA-NeMo/Automodel@{pinned} (AMD Primus's pin)",
            "generator": "tools/gen_amd_resolved.py", "keys": list(AUTOMODEL_COMPARED), "rows": rows}


def dump(table: dict[str, Any]) -> str:
    """One row per line: reviewable diffs, a small file."""
    head = {k: v for k, v in table.items() if k != "rows"}
    lines = [json.dumps(head)[:-1] + ', "rows": {']
    rows = list(table["rows"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}{',' if i < len(rows) - 1 else ''}" for i, (k, v) in enumerate(rows)]
    return "\n".join(lines) + "\n}}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="AMD Primus git directory (a bare mirror is fine)")
    parser.add_argument("--commit", default=SOURCE_COMMIT)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--out-torchtitan", type=Path, default=TORCHTITAN_OUT)
    parser.add_argument("--out-automodel", type=Path, default=AUTOMODEL_OUT)
    parser.add_argument("--framework", choices=("megatron", "torchtitan", "nemo_automodel"), action="append",
                        help="generate this framework's table only (repeatable; default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the tables; exit 1 on a difference")
    args = parser.parse_args(argv)
    tables = {"megatron": (generate, args.out), "torchtitan": (generate_torchtitan, args.out_torchtitan),
              "nemo_automodel": (generate_automodel, args.out_automodel)}
    stale = []
    for framework in args.framework or list(tables):
        make, out = tables[framework]
        text = dump(make(args.git_dir, args.commit))
        if not args.check:
            out.write_text(text)
        elif not out.exists() or out.read_text() != text:
            stale.append(str(out))
    for out in stale:
        print(f"gen_amd_resolved: {out} differs from a fresh generation")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
