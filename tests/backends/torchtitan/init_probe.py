"""Build TorchTitan's real Trainer from a Primus module section and save its initial weights.

Run under ``torch.distributed.run`` (or plain python for one rank):
``init_probe.py PARAMS.json OUT.pt [--without PATCH]``. Rank 0 writes every parameter as a full
(gathered) tensor, plus each rank's local shards, so a test can compare layouts bit for bit.
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from primus.backends.torchtitan.patches import PATCHES
from primus.runtime.patches import Where, apply_for_process


def main() -> None:
    params_file, out = Path(sys.argv[1]), Path(sys.argv[2])
    without = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--without" else None
    apply_for_process([patch for patch in PATCHES if patch.name != without], Where.here(()))

    from primus.backends.torchtitan.recipes.pretrain import register_local_datasets, with_tiny_assets
    from primus.backends.torchtitan.config import build_trainer_config
    from primus.data.tiny_assets import ensure_tiny_assets, tiny_assets_dir

    params = json.loads(params_file.read_text())
    ensure_tiny_assets(tiny_assets_dir(params))
    register_local_datasets()
    cfg, _, _ = build_trainer_config(with_tiny_assets(params), run_dir=out.parent / "run", device="cpu")
    trainer = cfg.build()
    full, local = {}, {}
    for part in trainer.model_parts:
        for name, param in part.named_parameters():
            is_dtensor = hasattr(param, "full_tensor")
            full[name] = (param.full_tensor() if is_dtensor else param).detach().clone()
            local[name] = (param.to_local() if is_dtensor else param).detach().clone()
    shards = [None] * dist.get_world_size() if dist.is_initialized() else [local]
    if dist.is_initialized():
        dist.all_gather_object(shards, local)
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save({"full": full, "shards": shards}, out)
    trainer.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main() or 0)
