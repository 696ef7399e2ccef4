"""One rank of a LoRA Megatron model restored from a run's checkpoint: its logits' distance to an exported HF model's.

    torchrun --nproc-per-node N lora_logits_worker.py HF_DIR CHECKPOINT_ITER_DIR EXPORTED_DIR LORA_JSON OUT.json TP

The model is built as the trainer builds it (HF base weights, then ``apply_lora``), then the run's
torch_dist checkpoint (base + adapters) is loaded into it: the adapters stay unmerged. Rank 0
compares the full-vocabulary logits with transformers' model of the exported (merged) folder, fp32.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main() -> int:
    hf_dir, iter_dir, exported, lora_json, out = map(Path, sys.argv[1:6])
    tp = int(sys.argv[6])
    import torch

    torch.set_num_threads(1)
    from primus.backends.megatron.cpu_patches import apply_cpu_patches

    apply_cpu_patches()
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    from primus.backends.megatron.adapter import megatron_params
    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.checkpoint import _metadata
    from primus.backends.megatron.lora import LoRAConfig, apply_lora
    from primus.backends.megatron.model import Derived, build_model, padded_vocab_size, transformer_config
    from primus.hf.megatron_start import post_training

    params = {"hf_path": str(hf_dir), "seq_length": 16, "train_iters": 1, "lr": 0.0, "tensor_model_parallel_size": tp,
              "bf16": False, "micro_batch_size": 1, "mock_data": True}
    args = parse_args(megatron_params(params))
    config = transformer_config(args, on_gpu=False, derived=Derived())
    chunks = build_model(args, config, padded_vocab_size(args.vocab_size, args), use_te=False)
    ctx = type("Ctx", (), {"logger": logging.getLogger("worker"), "rank": dist.get_rank()})()
    post_training(params, "pretrain").load_weights(chunks, ctx)
    apply_lora(chunks, LoRAConfig(**json.loads(lora_json.read_text())), config, seed=0)
    state = {"model": chunks[0].sharded_state_dict(prefix="", metadata=_metadata(False))}
    loaded = dist_checkpointing.load(state, str(iter_dir))
    chunks[0].load_state_dict(loaded["model"], strict=True)
    tokens = torch.arange(3, 3 + 2 * 16).remainder(args.vocab_size).view(2, 16)
    positions = torch.arange(16).expand(2, 16)
    with torch.no_grad():
        local = chunks[0](tokens, positions, None)  # [b, s, vocab / tp]
    pieces = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(pieces, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    logits = torch.cat(pieces, dim=-1)[..., : args.vocab_size]
    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        with torch.no_grad():
            merged = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()(tokens).logits
            base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()(tokens).logits
        out.write_text(json.dumps({"max_abs_diff": (logits - merged).abs().max().item(),
                                   "adapter_effect": (logits - base).abs().max().item(),
                                   "scale": merged.abs().max().item(), "shape": list(logits.shape)}))
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
