"""One rank of a checkpoint written as Megatron-LM writes ``ckpt_format: torch`` on a GPU node.

    torchrun --nproc-per-node TP*PP megatron_lm_legacy_writer.py SOURCE_ITER_DIR TARGET_ROOT PARAMS_JSON

Builds this rank's megatron-core GPTModel (TP x PP as PARAMS_JSON says), loads the weights of
SOURCE_ITER_DIR's file for this rank with megatron-core's own ``load_state_dict``, and writes
``TARGET_ROOT/iter_NNNNNNN/mp_rank_TT_PPP/model_optim_rng.pt`` holding what Megatron-LM's
``save_checkpoint`` stores without the optimizer (``--no-save-optim``): ``args`` (an
``argparse.Namespace`` with Megatron-LM's own objects in it), ``checkpoint_version``, ``iteration``,
``model`` (megatron-core's ``state_dict_for_save_checkpoint()`` under the names a Transformer
Engine model has: the layer norms fused into ``linear_qkv`` / ``linear_fc1``, plus TE's
``_extra_state``), ``rng_state`` (CUDA generator states, as a GPU run has) and
``num_floating_point_operations_so_far``; then ``latest_checkpointed_iteration.txt``.
"""
from __future__ import annotations

import argparse
import io
import json
import random
import sys
from pathlib import Path

# Megatron-LM's GPU default (transformer_impl: transformer_engine) names these tensors so.
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def megatron_lm_names(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        head, _, tail = key.partition(".layers.")
        number, _, rest = tail.partition(".")
        if tail and rest in TE_NAMES:
            key = f"{head}.layers.{number}.{TE_NAMES[rest]}"
        out[key] = value
        if tail and rest == "self_attention.linear_proj.weight":  # TE's attention keeps FP8 metadata
            out[f"{head}.layers.{number}.self_attention.core_attention._extra_state"] = io.BytesIO()
    return out


def main() -> None:
    source, target, params_file = (Path(a) for a in sys.argv[1:4])
    import numpy
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.transformer.enums import AttnBackend

    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.patches import apply_patches
    from primus.backends.megatron.model import Derived, build_model, transformer_config

    apply_patches()
    args = parse_args(json.loads(params_file.read_text()))
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    rank_dir = f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}_{ps.get_pipeline_model_parallel_rank():03d}"
    saved = torch.load(source / rank_dir / "model_optim_rng.pt", map_location="cpu", weights_only=True)
    weights = saved["model"]
    vocab = next(weights[k].shape[0] for k in ("embedding.word_embeddings.weight", "output_layer.weight")
                 if k in weights) * tp
    model = build_model(args, transformer_config(args, on_gpu=False, derived=Derived()), vocab, use_te=False)[0]
    model.load_state_dict(weights, strict=True)
    namespace = argparse.Namespace(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=1, world_size=tp * pp,
        consumed_train_samples=saved["args"].consumed_train_samples, consumed_valid_samples=0,
        params_dtype=torch.float32, attention_backend=AttnBackend.auto, transformer_impl="transformer_engine",
        ckpt_format="torch", no_save_optim=True)
    gpu_generator = torch.zeros(16, dtype=torch.uint8)  # torch.cuda.get_rng_state(): seed + offset
    rng = {"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
           "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": gpu_generator,
           "rng_tracker_states": {"model-parallel-rng": gpu_generator.clone()}}
    state = {"args": namespace, "checkpoint_version": 3.0, "iteration": saved["iteration"],
             "model": megatron_lm_names(model.state_dict_for_save_checkpoint()), "rng_state": [rng],
             "num_floating_point_operations_so_far": 1.0e12}
    file = target / f"iter_{saved['iteration']:07d}" / rank_dir / "model_optim_rng.pt"
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, file)
    dist.barrier()
    if dist.get_rank() == 0:
        (target / "latest_checkpointed_iteration.txt").write_text(str(saved["iteration"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main() or 0)
