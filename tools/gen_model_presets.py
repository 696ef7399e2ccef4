#!/usr/bin/env python3
"""Generate the Megatron model library (primus/configs/models/megatron/) from AMD Primus's presets.

Two files per model, so that an AMD Primus experiment trains what AMD Primus trains and a user who
wants the published network can name it:

- ``<name>.yaml`` (AMD Primus's name, ``model: llama3.1_8B.yaml``): the network AMD Primus builds from
  its preset. Its ``extends:``/``bases:`` chain resolved, reduced to the Megatron-LM arguments AMD
  Primus hands to Megatron-LM: its ``MegatronArgBuilder`` keeps only keys that are Megatron-LM argparse
  dests (at d3528a2) and silently drops the rest, so ``norm_epsilon`` (``--norm-epsilon``'s dest is
  ``layernorm_epsilon``) is dropped and Megatron-LM's 1e-5 runs; the header names each such key.
- ``published/<name>.yaml``: the published network (``model: published/qwen3_32B.yaml``):
  ``norm_epsilon`` under Megatron-LM's dest ``layernorm_epsilon``, and ``CORRECTIONS`` where AMD
  Primus's preset is not the published network (e.g. Llama 3.2 ties its embeddings, Qwen3-32B has
  128-wide heads), the published value with the config.json key it comes from.

Both: keys equal to Megatron-LM's default left out (Megatron-LM supplies them), kernel/fusion/parallelism
keys dropped, ``vocab_size`` added from the model's Hugging Face config.json (AMD Primus takes the
vocabulary from the tokenizer at run time, but planning has no tokenizer and a checkpoint needs the real
size), AMD Primus's tokenizer aliases (``Llama3Tokenizer`` ...), all built as ``HuggingFaceTokenizer``,
written as ``HuggingFaceTokenizer``. Every edit is written into the file's header.

Usage:
    python tools/gen_model_presets.py [--git-dir AMD_PRIMUS_GIT_DIR] [--commit fd1eeab] [--out DIR] [--check]
"""
from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SOURCE_REPO = "AMD-AGI/Primus"
SOURCE_DIR = "primus/configs/models/megatron"
SOURCE_COMMIT = "fd1eeabbad15135e3702094087e96142b4b4eacb"
DEFAULT_GIT_DIR = os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo")
OUT_DIR = Path(__file__).resolve().parents[1] / "primus" / "configs" / "models" / "megatron"

# Megatron-LM d3528a2 defaults of the keys kept, in the order they are written.
# A key whose resolved value equals its default is left out (Megatron-LM supplies it).
ALWAYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
DEFAULTS: dict[str, Any] = {
    "num_layers": None, "hidden_size": None, "ffn_hidden_size": None, "num_attention_heads": None,
    "group_query_attention": False, "num_query_groups": 1, "kv_channels": None, "add_qkv_bias": False,
    "qk_layernorm": False, "qk_l2_norm": False, "add_bias_linear": True, "swiglu": False, "openai_gelu": False,
    "squared_relu": False, "quick_geglu": False, "normalization": "LayerNorm", "layernorm_epsilon": 1e-5,
    "apply_residual_connection_post_layernorm": False, "untie_embeddings_and_output_weights": False,
    "vocab_size": None, "hidden_dropout": 0.1, "attention_dropout": 0.1, "init_method_std": 0.02,
    "position_embedding_type": "learned_absolute", "max_position_embeddings": None, "rotary_base": 10000,
    "rotary_percent": 1.0, "rotary_interleaved": False, "rotary_seq_len_interpolation_factor": None,
    "use_rope_scaling": False, "rope_scaling_factor": 8.0,
}
MLA_DEFAULTS: dict[str, Any] = {  # kept only with multi_latent_attention
    "multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "rope_type": None, "rotary_scaling_factor": 1.0,
    "mscale": 1.0, "mscale_all_dim": 0.0,
}
MOE_DEFAULTS: dict[str, Any] = {  # kept only with num_experts
    "num_experts": None, "moe_layer_freq": 1, "moe_ffn_hidden_size": None,
    "moe_shared_expert_intermediate_size": None, "moe_shared_expert_gate": False, "moe_router_topk": 2,
    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": None,
    "moe_router_score_function": "softmax", "moe_router_pre_softmax": False, "moe_router_num_groups": None,
    "moe_router_group_topk": None, "moe_router_topk_scaling_factor": None, "moe_router_enable_expert_bias": False,
    "moe_router_bias_update_rate": 1e-3, "moe_router_dtype": None, "moe_input_jitter_eps": None,
    "moe_expert_capacity_factor": None, "moe_pad_expert_input_to_capacity": False, "moe_token_drop_policy": "probs",
}
MTP_DEFAULTS: dict[str, Any] = {"mtp_num_layers": None, "mtp_loss_scaling_factor": 0.1}  # kept only with MTP
TOKENIZER_KEYS = ("tokenizer_type", "tokenizer_model")
# Run settings AMD Primus's model presets carry (language_model.yaml) that change a run: kept under AMD's names.
# sequence_parallel: true (Megatron-LM turns it off at tensor_model_parallel_size 1, here as there).
AMD_RUN_KEYS: dict[str, Any] = {"sequence_parallel": False}
PUBLISHED = "published"  # the folder of the published networks: model: published/<name>.yaml
RENAMED = {"norm_epsilon": "layernorm_epsilon"}  # AMD's key -> Megatron-LM's dest (--norm-epsilon)
# AMD Primus builds each of these as Megatron-LM's HuggingFaceTokenizer on tokenizer_model
# (primus/backends/megatron/training/tokenizer/tokenizer.py, CUSTOM_TOKENIZER_TYPES).
HF_TOKENIZER_ALIASES = {"Llama2Tokenizer", "Llama3Tokenizer", "Llama4Tokenizer", "MixtralTokenizer",
                        "DeepSeekV2Tokenizer", "DeepSeekV3Tokenizer", "KimiK2Tokenizer"}
# Architecture keys AMD Primus adds to Megatron-LM (its own patches): named in the header when set.
AMD_ONLY = ("final_logit_softcapping", "attn_logit_softcapping", "router_logit_softcapping")


@dataclass(frozen=True)
class Model:
    name: str  # AMD Primus's file name, without .yaml
    title: str
    hf_repo: str  # where vocab_size and the corrections come from (its config.json)
    vocab_size: int
    corrections: dict[str, tuple[Any, str]] = field(default_factory=dict)  # key -> (value, why)
    vocab_source: str = "config.json vocab_size"


_LLAMA31_ROPE = {"use_rope_scaling": (True, "rope_scaling.rope_type llama3, factor 8")}
_LLAMA32 = {
    "untie_embeddings_and_output_weights": (False, "tie_word_embeddings: true"),
    "use_rope_scaling": (True, "rope_scaling.rope_type llama3"),
    "rope_scaling_factor": (32.0, "rope_scaling.factor 32"),
    "max_position_embeddings": (131072, "max_position_embeddings 131072"),
}
_QWEN25_BIAS = {"add_qkv_bias": (True, "Qwen2 attention has q/k/v biases")}
_QWEN3_CONTEXT = {"max_position_embeddings": (40960, "max_position_embeddings 40960")}
_QWEN3 = {"qk_layernorm": (True, "Qwen3 RMS-normalises q and k per head (q_norm, k_norm)"),
          "kv_channels": (128, "head_dim 128"), **_QWEN3_CONTEXT}
_GPT_OSS = {"qk_layernorm": (False, "no q/k norm (AMD Primus inherits DeepSeek's latent norms)"),
            "rotary_base": (150000, "rope_theta 150000")}
_TIED = {"untie_embeddings_and_output_weights": (False, "tie_word_embeddings: true")}

MODELS = [
    Model("llama2_7B", "Llama 2 7B", "meta-llama/Llama-2-7b-hf", 32000),
    Model("llama2_13B", "Llama 2 13B", "meta-llama/Llama-2-13b-hf", 32000),
    Model("llama2_70B", "Llama 2 70B", "meta-llama/Llama-2-70b-hf", 32000),
    Model("llama3_8B", "Llama 3 8B", "meta-llama/Meta-Llama-3-8B", 128256),
    Model("llama3_70B", "Llama 3 70B", "meta-llama/Meta-Llama-3-70B", 128256),
    Model("llama3.1_8B", "Llama 3.1 8B", "meta-llama/Llama-3.1-8B", 128256, _LLAMA31_ROPE),
    Model("llama3.1_70B", "Llama 3.1 70B", "meta-llama/Llama-3.1-70B", 128256, _LLAMA31_ROPE),
    Model("llama3.1_405B", "Llama 3.1 405B", "meta-llama/Llama-3.1-405B", 128256,
          {**_LLAMA31_ROPE, "max_position_embeddings": (131072, "max_position_embeddings 131072")}),
    Model("llama3.2_1B", "Llama 3.2 1B", "meta-llama/Llama-3.2-1B", 128256, _LLAMA32),
    Model("llama3.2_3B", "Llama 3.2 3B", "meta-llama/Llama-3.2-3B", 128256, _LLAMA32),
    Model("llama3.3_70B", "Llama 3.3 70B", "meta-llama/Llama-3.3-70B-Instruct", 128256, _LLAMA31_ROPE),
    Model("qwen2.5_3B", "Qwen2.5 3B", "Qwen/Qwen2.5-3B", 151936,
          {**_QWEN25_BIAS, **_TIED, "max_position_embeddings": (32768, "max_position_embeddings 32768")}),
    Model("qwen2.5_7B", "Qwen2.5 7B", "Qwen/Qwen2.5-7B", 152064, _QWEN25_BIAS),
    Model("qwen2.5_14B", "Qwen2.5 14B", "Qwen/Qwen2.5-14B", 152064, _QWEN25_BIAS),
    Model("qwen2.5_32B", "Qwen2.5 32B", "Qwen/Qwen2.5-32B", 152064, _QWEN25_BIAS),
    Model("qwen2.5_72B", "Qwen2.5 72B", "Qwen/Qwen2.5-72B", 152064, _QWEN25_BIAS),
    Model("qwen3_4B", "Qwen3 4B", "Qwen/Qwen3-4B", 151936,
          {**_QWEN3, **_TIED}),
    Model("qwen3_8B", "Qwen3 8B", "Qwen/Qwen3-8B", 151936, _QWEN3),
    Model("qwen3_14B", "Qwen3 14B", "Qwen/Qwen3-14B", 151936, _QWEN3),
    Model("qwen3_32B", "Qwen3 32B", "Qwen/Qwen3-32B", 151936, _QWEN3),
    Model("qwen3_30B_A3B", "Qwen3 30B-A3B (MoE: 128 experts, top-8)", "Qwen/Qwen3-30B-A3B", 151936, _QWEN3_CONTEXT),
    Model("qwen3_235B_A22B", "Qwen3 235B-A22B (MoE: 128 experts, top-8)", "Qwen/Qwen3-235B-A22B", 151936, _QWEN3_CONTEXT),
    Model("mixtral_8x7B_v0.1", "Mixtral 8x7B v0.1 (MoE: 8 experts, top-2)", "mistralai/Mixtral-8x7B-v0.1", 32000),
    Model("mixtral_8x22B_v0.1", "Mixtral 8x22B v0.1 (MoE: 8 experts, top-2)", "mistralai/Mixtral-8x22B-v0.1", 32768),
    Model("deepseek_v2_lite", "DeepSeek-V2-Lite (MLA; MoE: 64 experts, top-6, 2 shared)",
          "deepseek-ai/DeepSeek-V2-Lite", 102400),
    Model("deepseek_v2", "DeepSeek-V2 (MLA; MoE: 160 experts, top-6, 2 shared)", "deepseek-ai/DeepSeek-V2", 102400),
    Model("deepseek_v3", "DeepSeek-V3 (MLA; MoE: 256 experts, top-8, 1 shared; 1 MTP layer)",
          "deepseek-ai/DeepSeek-V3", 129280),
    Model("gpt_oss_20B", "gpt-oss-20b (MoE: 32 experts, top-4)", "openai/gpt-oss-20b", 201088, {
        "moe_shared_expert_intermediate_size": (None, "gpt-oss has no shared expert"),
        "tokenizer_model": ("openai/gpt-oss-20b", "o200k_harmony tokenizer (AMD Primus borrows DeepSeek-V2-Lite's)"),
        **_GPT_OSS,
    }),
    Model("gpt_oss_120B", "gpt-oss-120b (MoE: 128 experts, top-4)", "openai/gpt-oss-120b", 201088, {
        "moe_shared_expert_intermediate_size": (None, "gpt-oss has no shared expert"),
        "tokenizer_model": ("openai/gpt-oss-120b", "o200k_harmony tokenizer (AMD Primus borrows DeepSeek-V2-Lite's)"),
        **_GPT_OSS,
    }),
    Model("llama4_17B16E", "Llama 4 Scout 17B-16E (MoE: 16 experts, top-1, 1 shared)",
          "meta-llama/Llama-4-Scout-17B-16E", 202048),
    Model("llama4_17B128E", "Llama 4 Maverick 17B-128E (MoE every 2nd layer: 128 experts, top-1, 1 shared)",
          "meta-llama/Llama-4-Maverick-17B-128E", 202048),
    Model("qwen3_235B_A22B_4layer", "Qwen3 235B-A22B cut to 4 layers (AMD's short test model)",
          "Qwen/Qwen3-235B-A22B", 151936, _QWEN3_CONTEXT),
    Model("deepseek_r1_distill_qwen_1.5B", "DeepSeek-R1-Distill-Qwen-1.5B (Qwen2 1.5B)",
          "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 151936, _QWEN25_BIAS),
    Model("kimi_k2", "Kimi K2 (DeepSeek-V3 architecture: MLA; MoE: 384 experts, top-8, 1 shared)",
          "moonshotai/Kimi-K2-Instruct", 163840, {
              "rotary_base": (50000, "rope_theta 50000"),
              "rotary_scaling_factor": (32.0, "rope_scaling.factor 32 (yarn)"),
              "moe_router_topk_scaling_factor": (2.827, "routed_scaling_factor 2.827"),
          }),
    Model("grok1", "Grok-1 (MoE: 8 experts, top-2)", "xai-org/grok-1", 131072,
          vocab_source="run.py vocab_size=128 * 1024; AMD Primus borrows Mixtral's tokenizer"),
    Model("grok2", "Grok-2 (MoE: 8 experts, top-2, plus a dense residual MLP)", "xai-org/grok-2", 131072, {
        "moe_shared_expert_intermediate_size": (32768, "residual_moe: a dense MLP of intermediate_size 32768 "
                                                       "beside the experts"),
    }),
]


def git_show(git_dir: str, commit: str, path: str) -> str:
    result = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"gen_model_presets: cannot read {path} at {commit} from {git_dir}: {result.stderr.strip()}")
    return result.stdout


def resolve_chain(git_dir: str, commit: str, name: str) -> tuple[dict[str, Any], list[str]]:
    """AMD Primus's merge of ``name`` and its ``extends:``/``bases:`` parents (parents first, later wins;
    its loader's deep merge is a plain update for these flat files), and the chain of file names."""
    data = yaml.safe_load(git_show(git_dir, commit, f"{SOURCE_DIR}/{name}")) or {}
    parents = data.pop("extends", None) or data.pop("bases", None) or []
    merged: dict[str, Any] = {}
    chain = [name]
    for parent in [parents] if isinstance(parents, str) else parents:
        values, parent_chain = resolve_chain(git_dir, commit, parent)
        merged.update(values)
        chain += parent_chain
    merged.update(data)
    return merged, chain


def _normalise(key: str, value: Any) -> Any:
    if key == "moe_layer_freq" and isinstance(value, str) and "[" not in value:
        return int(value)  # Megatron-LM's moe_freq_type reads "1" as 1
    return value


def reduce(model: Model, amd: dict[str, Any], published: bool) -> tuple[dict[str, Any], list[str]]:
    """The kept keys (in write order) and the header notes saying what changed from AMD Primus's file:
    ``published`` applies the renames and corrections; otherwise the network is AMD Primus's own."""
    if published:
        values = {RENAMED.get(k, k): _normalise(RENAMED.get(k, k), v) for k, v in amd.items()}
    else:
        values = {k: _normalise(k, v) for k, v in amd.items() if k not in RENAMED}
    notes = [f"vocab_size {model.vocab_size} added ({model.hf_repo} {model.vocab_source}; "
             "AMD Primus takes it from the tokenizer)"]
    values["vocab_size"] = model.vocab_size
    for old, new in RENAMED.items():
        if old not in amd:
            continue
        if published:
            notes.append(f"{old} written as {new} (Megatron-LM's dest for --norm-epsilon)")
        elif amd[old] != DEFAULTS[new]:
            notes.append(f"{old}: {amd[old]} not carried: AMD Primus hands Megatron-LM argument dests only and drops "
                         f"it ({new} is --norm-epsilon's dest), so Megatron-LM's {DEFAULTS[new]} runs")
    if values.get("tokenizer_type") in HF_TOKENIZER_ALIASES:
        notes.append(f"tokenizer_type {values['tokenizer_type']} written as HuggingFaceTokenizer "
                     "(AMD Primus builds its alias as one)")
        values["tokenizer_type"] = "HuggingFaceTokenizer"
    for key, (value, why) in (model.corrections.items() if published else ()):
        notes.append(f"corrected {key}: {values.get(key)!r} -> {value!r} ({model.hf_repo}: {why})")
        values[key] = value
    for key in AMD_ONLY:
        if values.get(key) is not None:
            notes.append(f"not carried: {key}: {values[key]} (an AMD Primus extension; Megatron-LM has no such argument)")

    table = dict(DEFAULTS)
    if values.get("multi_latent_attention"):
        table.update(MLA_DEFAULTS)
    if values.get("num_experts"):
        table.update(MOE_DEFAULTS)
    if values.get("mtp_num_layers"):
        table.update(MTP_DEFAULTS)
    # None means "unset" in AMD Primus's presets: Megatron-LM's default applies
    kept = {key: values[key] for key, default in table.items()
            if values.get(key) is not None and (key in ALWAYS or values[key] != default)}
    kept.update({key: values[key] for key in TOKENIZER_KEYS if values.get(key) is not None})
    if not published:  # what AMD Primus's preset turns on for every run of it (Megatron-LM's rules still apply)
        kept.update({key: values[key] for key, default in AMD_RUN_KEYS.items() if values.get(key, default) != default})
    return kept, notes


def render(model: Model, kept: dict[str, Any], notes: list[str], chain: list[str], commit: str,
           published: bool) -> str:
    title = (f"# {model.title}, the published network (model: {PUBLISHED}/{model.name}.yaml)." if published else
             f"# {model.title} as AMD Primus builds it, under its name (model: {model.name}.yaml).")
    lines = [
        title,
        "# GENERATED by tools/gen_model_presets.py -- do not edit; regenerate instead.",
        f"# Source: {SOURCE_REPO} {SOURCE_DIR}/{model.name}.yaml at {commit}",
        f"#   resolved through: {' <- '.join(chain)}",
        "# Kept: architecture and tokenizer keys (Megatron-LM argument names) that differ from Megatron-LM's",
        "# defaults; kernel, fusion and parallelism keys dropped. Changed from AMD Primus:",
        *(f"#   - {note}" for note in notes),
    ]
    body = yaml.safe_dump(kept, sort_keys=False, default_flow_style=False, width=120)
    return "\n".join(lines) + "\n" + body


def generate(git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT) -> dict[str, str]:
    """File name (relative to the library) -> text, for every model in MODELS, AMD's and published."""
    full = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", commit], capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"gen_model_presets: no commit {commit} in {git_dir}")
    commit = full.stdout.strip()
    files = {}
    for model in MODELS:
        amd, chain = resolve_chain(git_dir, commit, f"{model.name}.yaml")
        for published in (False, True):
            kept, notes = reduce(model, amd, published)
            name = f"{PUBLISHED}/{model.name}.yaml" if published else f"{model.name}.yaml"
            files[name] = render(model, kept, notes, chain, commit, published)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="AMD Primus git directory (a bare mirror is fine)")
    parser.add_argument("--commit", default=SOURCE_COMMIT)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    files = generate(args.git_dir, args.commit)
    stale = []
    for name, text in files.items():
        path = args.out / name
        if args.check:
            current = path.read_text() if path.exists() else ""
            if current != text:
                stale.append(name)
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(path), name))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"gen_model_presets: {len(stale)} preset(s) differ from a fresh generation: {', '.join(stale)}")
        return 1
    if not args.check:
        print(f"wrote {len(files)} presets to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
