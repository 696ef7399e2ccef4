"""TorchTitan's checkpoint layout: one DCP directory per saved step, named ``step-N``."""
from __future__ import annotations

from pathlib import Path

STEP = r"step-(\d+)"  # TorchTitan's name of one saved step (DCP)


def foreign_checkpoint(path: Path) -> str | None:
    """A Megatron checkpoint under TorchTitan's step name: torch_dist's side files (``metadata.json``,
    ``common.pt``) or Megatron-LM's legacy ``mp_rank_*`` folders. (The reverse cannot be told by its
    files: Megatron's ``fsdp_dtensor`` format is a plain DCP directory too; the resume shape check
    names it.)"""
    if any(child.is_dir() and child.name.startswith("mp_rank_") for child in path.iterdir()):
        return f"{path} holds a Megatron-LM legacy checkpoint (mp_rank_* folders), not TorchTitan's"
    if (path / "metadata.json").exists() or (path / "common.pt").exists():
        return f"{path} holds a Megatron checkpoint (metadata.json, common.pt), not TorchTitan's"
    return None
