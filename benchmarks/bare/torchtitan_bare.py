"""TorchTitan 0.3.0 driven directly: ``Trainer.Config`` built by hand, ``cfg.build()``, ``train()``.

The baseline for Primus's overhead. Only TorchTitan's public API is used to build the config,
the model spec and the dataset entry. The one thing taken from Primus is its CPU patch module
(``primus.backends.torchtitan.patches``): the bare engine cannot run on a CPU-only host without
those patches (device type "cuda" at import, a hard ``import triton``, torch 2.13's missing
``dist.set_timeout``, gloo's missing PREMUL_SUM), so both runs carry them.

    python -m benchmarks.bare.torchtitan_bare --preset benchmarks/configs/presets/llama_25m.yaml \
        --assets .cache/primus/tiny_llm --dump /tmp/tt --steps 12 --batch 2 --seq 256

The config values mirror ``primus/configs/modules/torchtitan/pre_trainer.yaml`` + the benchmark
experiment + Primus's CPU derivations; ``benchmarks.overhead`` checks they are identical to what
Primus builds (``repr`` of both ``Trainer.Config`` trees) before timing anything.
"""
from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import yaml


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True, help="model preset YAML (the neutral `model:` block)")
    p.add_argument("--assets", required=True, help="tiny_llm dir: tokenizer/ and corpus/")
    p.add_argument("--dump", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ac", default="none", choices=["none", "selective", "full"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--impl", default="foreach", choices=["foreach", "for-loop"])
    p.add_argument("--dp-shard", type=int, default=-1)
    p.add_argument("--dp-replicate", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--checkpoint-interval", type=int, default=0, help="0: checkpoints off (default)")
    p.add_argument("--without-patch", action="append", default=[], metavar="NAME",
                   help="leave this Primus patch out (to measure the upstream behaviour it fixes)")
    return p.parse_args(argv)


def ffn_dim(m: dict) -> int:
    if m.get("ffn_hidden_size"):
        return m["ffn_hidden_size"]
    hidden = int(2 * 4 * m["dim"] / 3)
    if m.get("ffn_dim_multiplier") is not None:
        hidden = int(m["ffn_dim_multiplier"] * hidden)
    mult = m.get("multiple_of", 256)
    return mult * ((hidden + mult - 1) // mult)


def model_spec(m: dict):
    """A llama3 ``ModelSpec`` the way torchtitan's model_registry builds its flavors, with SDPA
    attention (FlexAttention has no CPU backward in torch 2.13)."""
    import torch.nn as nn
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import depth_scaled_std
    from torchtitan.models.llama3 import Llama3StateDictAdapter, parallelize_llama
    from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
    from torchtitan.protocols.model_spec import ModelSpec

    dim, eps = m["dim"], m.get("norm_eps", 1e-5)
    linear_init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm_init = {"weight": nn.init.ones_}
    out_std = dim ** -0.5
    output_init = {"weight": partial(nn.init.trunc_normal_, std=out_std, a=-3 * out_std, b=3 * out_std),
                   "bias": nn.init.zeros_}

    def depth_init(layer_id):
        return {"weight": partial(nn.init.trunc_normal_, std=depth_scaled_std(0.02, layer_id)), "bias": nn.init.zeros_}

    def norm():
        return RMSNorm.Config(normalized_shape=dim, eps=eps, param_init=norm_init)

    rope = ComplexRoPE.Config(dim=dim // m["n_heads"], max_seq_len=m.get("max_seq_len", 131072),
                              theta=float(m.get("rope_theta", 500000.0)), scaling=m.get("rope_scaling") or "none")
    layers = [Llama3TransformerBlock.Config(
        attention_norm=norm(), ffn_norm=norm(),
        attention=make_gqa_config(dim=dim, n_heads=m["n_heads"], n_kv_heads=m.get("n_kv_heads"),
                                  wqkv_param_init=linear_init, wo_param_init=depth_init(i),
                                  inner_attention=ScaledDotProductAttention.Config(), rope=rope, fuse_qkv=True),
        feed_forward=make_ffn_config(dim=dim, hidden_dim=ffn_dim(m), w1_param_init=linear_init,
                                     w2w3_param_init=depth_init(i)),
    ) for i in range(m["n_layers"])]
    model = Llama3Model.Config(
        dim=dim, vocab_size=m["vocab_size"],
        tok_embeddings=Embedding.Config(num_embeddings=m["vocab_size"], embedding_dim=dim,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=norm(), lm_head=Linear.Config(in_features=dim, out_features=m["vocab_size"], param_init=output_init),
        layers=layers, enable_weight_tying=bool(m.get("tie_embeddings", False)))
    return ModelSpec(name="llama3", flavor=m.get("family", "llama3"), model=model, parallelize_fn=parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None,
                     state_dict_adapter=Llama3StateDictAdapter)


def register_jsonl() -> None:
    """TorchTitan's dataset extension point (its ``DATASETS`` table) for a local jsonl folder."""
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def files(path):
        p = Path(path)
        return sorted(str(f) for f in p.glob("*.jsonl")) if p.is_dir() else [str(p)]

    DATASETS.setdefault("jsonl", DatasetConfig(
        path="", sample_processor=lambda sample: sample["text"],
        loader=lambda path: load_dataset("json", data_files=files(path), split="train")))


def build_config(args: argparse.Namespace):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import ParamGroupConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    m = yaml.safe_load(Path(args.preset).read_text())["model"]
    assets = Path(args.assets).expanduser().absolute()
    cfg = Trainer.Config(dataloader=HuggingFaceTextDataLoader.Config())
    cfg.model_spec = model_spec(m)
    cfg.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=m["vocab_size"]))
    cfg.optimizer.param_groups = [ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={
        "lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1})]
    cfg.optimizer.implementation = args.impl
    cfg.activation_checkpoint = {"none": None, "selective": SelectiveAC.Config, "full": FullAC.Config}[args.ac]
    if cfg.activation_checkpoint is not None:
        cfg.activation_checkpoint = cfg.activation_checkpoint()
    cfg.hf_assets_path = str(assets / "tokenizer")
    t = cfg.training
    t.local_batch_size, t.seq_len, t.steps, t.max_norm = args.batch, args.seq, args.steps, 1.0
    t.mixed_precision_param = "float32"          # CPU: no bf16 FSDP mixed precision
    t.disable_cuda_graphs = True                 # CPU: no CUDA graphs
    s = cfg.lr_scheduler
    s.warmup_steps, s.decay_ratio, s.decay_type, s.min_lr_factor = args.warmup, 0.8, "linear", 0.0
    par = cfg.parallelism
    par.data_parallel_replicate_degree, par.data_parallel_shard_degree = args.dp_replicate, args.dp_shard
    par.tensor_parallel_degree, par.pipeline_parallel_degree = args.tp, 1
    par.spmd_backend = "partial_dtensor"         # spmd_types fails with >1 rank on torch 2.13 CPU
    ck = cfg.checkpoint
    ck.enable, ck.interval, ck.keep_latest_k, ck.last_save_model_only, ck.folder = False, 500, 3, False, "checkpoints"
    if args.checkpoint_interval:
        ck.enable, ck.interval = True, args.checkpoint_interval
    cfg.compile.enable = args.compile
    cfg.dataloader.dataset, cfg.dataloader.dataset_path = "jsonl", str(assets / "corpus")
    cfg.metrics.log_freq, cfg.metrics.enable_tensorboard, cfg.metrics.disable_color_printing = 1, False, True
    cfg.debug.seed = 42
    cfg.dump_folder = str(Path(args.dump).absolute())
    return cfg


def main(argv=None) -> int:
    args = parse_args(argv)
    from primus.backends.torchtitan.patches import PATCHES  # CPU-only host: see module docstring
    from primus.runtime.patches import Where

    for patch in PATCHES:
        if patch.name not in args.without_patch and patch.verdict(Where.here(()))[0]:
            patch.apply()
    import torch.distributed as dist
    from torchtitan.tools.logging import init_logger

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29531")}.items():
        os.environ.setdefault(key, value)
    init_logger()
    register_jsonl()
    trainer = build_config(args).build()
    try:
        trainer.train()
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
