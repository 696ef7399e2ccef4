"""Build the backend's megatron-core model on this rank and save its initial weights.

    torchrun --nproc-per-node N init_dump.py OUT_PREFIX PARAMS_JSON [--without PATCH_NAME]

Writes OUT_PREFIX.rank<R>.pt (the local state dict) and OUT_PREFIX.rank<R>.json (this rank's
tensor- and expert-parallel rank). ``--without`` leaves one CPU patch out (to show what it fixes).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path


def main() -> int:
    warnings.simplefilter("ignore")
    out, params = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    without = sys.argv[sys.argv.index("--without") + 1] if "--without" in sys.argv else None
    import torch
    import torch.distributed as dist

    from primus.backends.megatron.patches import PATCHES

    for patch in PATCHES:
        if patch.name != without:
            patch.apply()
    from megatron.core import parallel_state

    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.model import Derived, build_model, transformer_config
    from primus.backends.megatron.trainer import set_random_seed

    dist.init_process_group("gloo")
    args = parse_args(params)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                             expert_model_parallel_size=args.expert_model_parallel_size)
    set_random_seed(args)
    model = build_model(args, transformer_config(args, on_gpu=False, derived=Derived()), 512, use_te=False)[0]
    rank = dist.get_rank()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()
                if torch.is_tensor(v) and "_extra_state" not in k}, f"{out}.rank{rank}.pt")
    Path(f"{out}.rank{rank}.json").write_text(json.dumps({
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "ep_rank": parallel_state.get_expert_model_parallel_rank()}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main())
