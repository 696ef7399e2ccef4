"""One rank of a Megatron model loaded from a HF checkpoint by Primus: write its logits' distance to HF's.

    torchrun --nproc-per-node N megatron_logits_worker.py HF_DIR OUT.json TP [EP]
    torchrun --nproc-per-node N megatron_logits_worker.py HF_DIR OUT.json TP EP HF_DIR OUT.json TP EP ...

The model is built and filled exactly as the trainer does (megatron_params -> parse_args ->
transformer_config -> build_model -> MegatronPostTraining.load_weights); rank 0 compares the
full-vocabulary logits on fixed tokens with transformers' own model in fp32. Several cases (groups of
four) share one launch: megatron-core's model-parallel state is rebuilt for each.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def start(tp: int, ep: int = 1):
    """CPU patches, gloo, megatron-core's parallel state; the torch and torch.distributed modules."""
    import torch

    torch.set_num_threads(1)
    from primus.backends.megatron.patches import apply_patches

    apply_patches()
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    return torch, dist


def model_from_hf(hf_dir: Path, tp: int, ep: int = 1):
    """(args, config, chunks): the model built and filled from ``hf_dir`` as the trainer does it."""
    import torch.distributed as dist

    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.model import Derived, build_model, padded_vocab_size, transformer_config
    from primus.backends.megatron.params import megatron_params
    from primus.backends.megatron.post_training import MegatronPostTraining

    params = {"hf_path": str(hf_dir), "seq_length": 16, "train_iters": 1, "lr": 0.0, "tensor_model_parallel_size": tp,
              **({"expert_model_parallel_size": ep} if ep > 1 else {}),
              "bf16": False, "micro_batch_size": 1, "mock_data": True}
    args = parse_args(megatron_params(params))
    config = transformer_config(args, on_gpu=False, derived=Derived())
    chunks = build_model(args, config, padded_vocab_size(args.vocab_size, args), use_te=False)
    ctx = type("Ctx", (), {"logger": logging.getLogger("worker"), "rank": dist.get_rank()})()
    MegatronPostTraining(Path(hf_dir).absolute(), None, str(hf_dir)).load_weights(chunks, ctx)
    return args, config, chunks


def full_logits(chunks, args, tp: int):
    """(tokens, the full-vocabulary logits on them), gathered over tensor parallelism."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    tokens = torch.arange(3, 3 + 2 * 16).remainder(args.vocab_size).view(2, 16)
    positions = torch.arange(16).expand(2, 16)
    with torch.no_grad():
        local = chunks[0](tokens, positions, None)  # [b, s, vocab / tp]
    pieces = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(pieces, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return tokens, torch.cat(pieces, dim=-1)[..., : args.vocab_size]


def finish(dist) -> int:
    from megatron.core import parallel_state

    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


def compare(torch, dist, hf_dir: Path, out: Path, tp: int, ep: int) -> None:
    """One case: rank 0 writes ``out``."""
    args, _, chunks = model_from_hf(hf_dir, tp, ep)
    tokens, logits = full_logits(chunks, args, tp)
    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            reference = hf(tokens).logits
        out.write_text(json.dumps({"max_abs_diff": (logits - reference).abs().max().item(),
                                   "scale": reference.abs().max().item(), "shape": list(logits.shape)}))


def main() -> int:
    words = sys.argv[1:] if len(sys.argv) != 4 else [*sys.argv[1:], "1"]
    cases = [(Path(words[i]), Path(words[i + 1]), int(words[i + 2]), int(words[i + 3]))
             for i in range(0, len(words), 4)]
    torch, dist = start(cases[0][2], cases[0][3])
    for index, (hf_dir, out, tp, ep) in enumerate(cases):
        if index:  # the next case's parallel layout on the same ranks
            from megatron.core import parallel_state, tensor_parallel

            dist.barrier()
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
            tensor_parallel.model_parallel_cuda_manual_seed(1)
        compare(torch, dist, hf_dir, out, tp, ep)
    return finish(dist)


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main())
