"""One rank of a LoRA Megatron model restored from a run's checkpoint: its logits' distance to an exported HF model's.

    torchrun --nproc-per-node N lora_logits_worker.py HF_DIR CHECKPOINT_ITER_DIR EXPORTED_DIR LORA_JSON OUT.json TP

The model is built as the trainer builds it (HF base weights, then ``apply_lora``), then the run's
torch_dist checkpoint (base + adapters) is loaded into it: the adapters stay unmerged. Rank 0
compares the full-vocabulary logits with transformers' model of the exported (merged) folder, fp32.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def main() -> int:
    hf_dir, iter_dir, exported, lora_json, out = map(Path, sys.argv[1:6])
    tp = int(sys.argv[6])
    from tests.hf.megatron_logits_worker import finish, full_logits, model_from_hf, start

    torch, dist = start(tp)
    from megatron.core import dist_checkpointing

    from primus.backends.megatron.checkpoint import _metadata
    from primus.backends.megatron.lora import LoRAConfig, apply_lora

    args, config, chunks = model_from_hf(hf_dir, tp)
    apply_lora(chunks, LoRAConfig(**json.loads(lora_json.read_text())), config, seed=0)
    state = {"model": chunks[0].sharded_state_dict(prefix="", metadata=_metadata(SimpleNamespace(use_distributed_optimizer=False)))}
    loaded = dist_checkpointing.load(state, str(iter_dir))
    chunks[0].load_state_dict(loaded["model"], strict=True)
    tokens, logits = full_logits(chunks, args, tp)
    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        with torch.no_grad():
            merged = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()(tokens).logits
            base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()(tokens).logits
        out.write_text(json.dumps({"max_abs_diff": (logits - merged).abs().max().item(),
                                   "adapter_effect": (logits - base).abs().max().item(),
                                   "scale": merged.abs().max().item(), "shape": list(logits.shape)}))
    return finish(dist)


if __name__ == "__main__":
    sys.exit(main())
