"""TorchTitan's Trainer, built by Primus for an SFT run from a HF checkpoint: its logits vs HF's.

    torchrun --nproc-per-node 1 torchtitan_logits_worker.py HF_DIR INSTRUCTIONS.jsonl RUN_DIR OUT.json

The trainer is built from the plan ``primus train`` builds (TorchTitanAdapter.plan -> its
``Trainer.Config`` -> Trainer), its checkpointer loads the HF safetensors through TorchTitan's
Llama3StateDictAdapter (what ``Trainer.train()`` does first), then the model's logits on fixed
tokens are compared with transformers' in fp32.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    hf_dir, data, run_dir, out = map(Path, sys.argv[1:5])
    import torch

    torch.set_num_threads(1)
    from primus.backends.torchtitan.adapter import TorchTitanAdapter
    from primus.backends.torchtitan.patches import apply_patches
    from primus.runtime.adapter import ModuleConfig

    apply_patches()  # the CPU shims a run applies (a pure plan applies none; this worker builds the trainer itself)

    params = {"attn_backend": "sdpa", "hf_assets_path": str(hf_dir),
              "checkpoint": {"enable": True, "initial_load_in_hf": True},
              "dataloader": {"dataset_path": str(data)}, "training": {"steps": 1, "local_batch_size": 2, "seq_len": 32,
                           # an fp32 comparison: FSDP2's bf16 MixedPrecisionPolicy (kept on a CPU with
                           # AVX512-BF16/AMX, primus.plan.devices.cpu_bf16_decision) would cost ~7e-3
                           "mixed_precision_param": "float32"},
              "optimizer": {"lr": 1e-3}}
    module = ModuleConfig("pre_trainer", "torchtitan", "sft", params)
    trainer = TorchTitanAdapter().plan(module, 1, run_dir=run_dir, device="cpu").engine_config.build()
    assert trainer.checkpointer.load(step=-1), "no checkpoint loaded"
    tokens = torch.arange(3, 3 + 2 * 16).remainder(512).view(2, 16)
    model = trainer.model_parts[0]
    model._skip_lm_head = False  # the chunked loss applies lm_head itself during training
    with torch.no_grad():
        logits = model(tokens).float()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(tokens).logits
    out.write_text(json.dumps({"max_abs_diff": (logits - reference).abs().max().item(),
                               "scale": reference.abs().max().item(), "shape": list(logits.shape)}))
    trainer.close()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main())
