"""megatron-core 0.16.1 driven directly: a minimal Megatron-LM ``pretrain`` loop over core's public API.

The baseline for Primus's Megatron overhead. megatron-core ships no trainer (the wheel has no
``megatron.training``), so this is the loop Megatron-LM's ``pretrain_gpt.py`` runs, cut to this
job (1 rank or data parallel), one loss line per step as its ``training_log``; no checkpoints.

The one thing taken from Primus is its CPU patches (``primus.backends.megatron.patches``, the NO_GPU ones):
megatron-core cannot run on a CPU-only torch without those shims (``torch.cuda.current_device()``
at its allocation sites, RNG streams kept in CUDA generators, literal ``device='cuda'`` scalars in
the optimizer, grad clipping and schedules, ``'torch.cuda.FloatTensor'`` type checks in clipping),
so both runs carry the same patches (they apply only where CUDA is absent; on a GPU this
runs as Megatron-LM does: NCCL, fused kernels, batches moved with ``.cuda()``). The data is pre-tokenized: GPTDataset only needs the
tokenizer's vocabulary size and EOD id, read with ``tokenizers`` as Primus does.

    python -m benchmarks.bare.megatron_bare --preset benchmarks/configs/presets/llama_25m.yaml \
        --assets .cache/primus/tiny_llm --dump /tmp/mg --steps 12 --batch 2 --seq 256

Values mirror Primus's megatron ``pre_trainer.yaml`` + the benchmark experiment + its CPU derivations;
``benchmarks.parity megatron`` checks every megatron-core constructor call and the initial weights.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import yaml

from benchmarks.bare.torchtitan_bare import ffn_dim  # the neutral preset's SwiGLU width rule


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True, help="model preset YAML (the neutral `model:` block)")
    p.add_argument("--assets", required=True, help="tiny_llm dir: tokenizer/ and megatron/tiny_text_document.bin/.idx")
    p.add_argument("--dump", required=True, help="output dir: the megatron-core configs used, as text")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=2, help="micro-batch size; global batch = batch x data-parallel size")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations")
    p.add_argument("--warmup-init", type=float, default=5e-4, help="learning rate at warm-up start")
    p.add_argument("--min-lr", type=float, default=0.0, help="learning rate at the end of the linear decay")
    return p.parse_args(argv)


class Tokenizer:
    """What GPTDataset reads from a tokenizer: ``vocab_size``, ``eod`` and cache identifiers."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer as HFTokenizer

        file = directory / "tokenizer.json"
        tok = HFTokenizer.from_file(str(file))
        self.vocab_size = tok.get_vocab_size()
        self.eod = tok.token_to_id(json.loads((directory / "tokenizer_config.json").read_text())["eos_token"])
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer_path": [str(file)]}


def setup(args: argparse.Namespace) -> SimpleNamespace:
    """Megatron-LM's initialize + ``setup_model_and_optimizer`` + ``build_train_valid_test_datasets``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.transformer_config import TransformerConfig

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    with socket.socket() as s:  # a free port unless a launcher gave one
        s.bind(("127.0.0.1", 0))
        os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    dp = parallel_state.get_data_parallel_world_size()
    mbs, gbs = args.batch, args.batch * dp
    init_num_microbatches_calculator(dist.get_rank(), None, gbs, mbs, dp)
    seed = 1234
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)

    m = yaml.safe_load(Path(args.preset).read_text())["model"]
    assets = Path(args.assets).expanduser().absolute()
    tokenizer = Tokenizer(assets / "tokenizer")
    vocab = m.get("vocab_size") or tokenizer.vocab_size
    vocab = -(-vocab // 128) * 128  # Megatron-LM pads to make_vocab_size_divisible_by (128) x TP
    kv_heads = m.get("n_kv_heads") or m["n_heads"]
    config = TransformerConfig(
        num_layers=m["n_layers"], hidden_size=m["dim"], ffn_hidden_size=ffn_dim(m), num_attention_heads=m["n_heads"],
        num_query_groups=kv_heads if kv_heads != m["n_heads"] else None, hidden_dropout=0.0, attention_dropout=0.0,
        layernorm_epsilon=m.get("norm_eps", 1e-5), normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, init_method_std=0.02,
        embedding_init_method_std=m.get("embedding_init_std"),  # None: megatron-core uses init_method_std
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        use_cpu_initialization=not on_gpu,  # CPU: no CUDA device to initialise on, no fused CUDA kernels below
        gradient_accumulation_fusion=on_gpu and importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None,
        bias_activation_fusion=on_gpu, bias_dropout_fusion=on_gpu, masked_softmax_fusion=on_gpu and importlib.util.find_spec("scaled_masked_softmax_cuda") is not None,
        persist_layer_norm=on_gpu and importlib.util.find_spec("apex") is not None,
        apply_rope_fusion=on_gpu and getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is not None,  # TE's kernel
        deallocate_pipeline_outputs=True)
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab,
        max_sequence_length=m.get("max_seq_len", 131072), share_embeddings_and_output_weights=bool(m.get("tie_embeddings")),
        position_embedding_type="rope", rotary_base=int(m.get("rope_theta", 500000)),
        rope_scaling=m.get("rope_scaling") == "llama")
    if on_gpu:
        model.cuda(torch.cuda.current_device())
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=False,
                                               overlap_param_gather=False, use_distributed_optimizer=False)
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        clip_grad=1.0, bf16=False, fp16=False, params_dtype=torch.float32, initial_loss_scale=2.0**32), [model])
    config.grad_scale_func = optimizer.scale_loss  # as Megatron-LM's train(): loss scaling, DP grad all-reduce
    config.finalize_model_grads_func = finalize_model_grads
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=args.warmup_init, max_lr=args.lr, min_lr=args.min_lr, lr_warmup_steps=args.warmup * gbs,
        lr_decay_steps=args.steps * gbs, lr_decay_style="linear", start_wd=0.1, end_wd=0.1,
        wd_incr_steps=args.steps * gbs, wd_incr_style="constant")
    data_config = GPTDatasetConfig(
        random_seed=seed, sequence_length=args.seq, blend=([str(assets / "megatron" / "tiny_text_document")], None),
        split="99,1,0", tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=True, data_parallel_size=dp)
    train_ds, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [args.steps * gbs, 0, 0], lambda: True,
                                                   data_config).build()
    return SimpleNamespace(config=config, model=model, optimizer=optimizer, scheduler=scheduler, train_ds=train_ds,
                           mbs=mbs, gbs=gbs, dp=dp, dp_rank=parallel_state.get_data_parallel_rank(),
                           configs=[config, ddp_config, optimizer.config, data_config])


def loss_func(loss_mask, output_tensor):
    """pretrain_gpt.py's loss: token-summed loss + token count; the schedule divides per micro-batch."""
    import torch

    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(output_tensor.float().view(-1) * loss_mask)
    num_tokens = loss_mask.sum().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.detach().view(1), num_tokens.float().view(1)])}


def forward_step(data_iterator, model):
    import torch

    batch = next(data_iterator)
    if torch.cuda.is_available():  # pretrain_gpt.py's get_batch: .cuda(non_blocking=True)
        batch = {key: value.cuda(non_blocking=True) for key, value in batch.items()}
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def train(job: SimpleNamespace, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    # MegatronPretrainingSampler's order from sample 0: rank d reads [d*mbs, (d+1)*mbs) of each global batch
    batches = [list(range(s + job.dp_rank * job.mbs, s + (job.dp_rank + 1) * job.mbs))
               for s in range(0, args.steps * job.gbs, job.gbs)]
    data = iter(torch.utils.data.DataLoader(job.train_ds, batch_sampler=batches))
    forward_backward = get_forward_backward_func()
    for iteration in range(1, args.steps + 1):
        start = time.perf_counter()
        job.model.zero_grad_buffer()
        job.optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=data, model=job.model,
                                  num_microbatches=1, seq_length=args.seq, micro_batch_size=job.mbs,
                                  forward_only=False)
        update_ok, grad_norm, _ = job.optimizer.step()
        lr = job.optimizer.param_groups[0]["lr"]  # the rate this step used (Megatron-LM logs the next one)
        if update_ok:
            job.scheduler.step(increment=job.gbs)
        total = sum(item["lm loss"] for item in losses)
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
        if dist.get_rank() == 0:
            print(f" iteration {iteration:8d}/{args.steps:8d} | consumed samples: {iteration * job.gbs:12d} | "
                  f"elapsed time per iteration (ms): {1000 * (time.perf_counter() - start):.1f} | "
                  f"learning rate: {lr:.6E} | global batch size: {job.gbs:5d} | "
                  f"lm loss: {(total[0] / total[1]).item():.6E} | grad norm: {grad_norm:.3f} |", flush=True)


def teardown() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator

    parallel_state.destroy_model_parallel()
    destroy_num_microbatches_calculator()
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    from primus.backends.megatron.patches import PATCHES  # CPU-only host: see module docstring
    from primus.runtime.patches import NO_GPU, Where, apply_for_process

    apply_for_process([patch for patch in PATCHES if patch.when is NO_GPU], Where.here(()))  # the CPU shims
    try:
        job = setup(args)
        dump = Path(args.dump)
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "megatron_config.txt").write_text("\n\n".join(repr(c) for c in job.configs) + "\n")
        train(job, args)
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
