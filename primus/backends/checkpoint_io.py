"""Reading the engines' saved checkpoints whole, for ``primus export`` (any TP/PP/DP layout wrote them).

A Megatron ``torch_dist`` or TorchTitan DCP checkpoint stores each tensor's global shape, and
``torch.distributed.checkpoint`` reassembles the shards in one process. Which directory is which
step is each engine's fact (its recipe passes the pattern).
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError


def saved_steps(root: Path, pattern: str, *, complete: str, offset: int = 0) -> dict[int, Path]:
    """{step: directory} of the checkpoints under ``root`` whose name matches ``pattern`` (the step its
    first group, plus ``offset``) and that hold ``complete`` (the file or folder written last)."""
    return {int(m.group(1)) + offset: path for path in Path(root).glob("*")
            if (m := re.fullmatch(pattern, path.name)) and (path / complete).exists()}


def pick_step(steps: dict[int, Path], step: int | None, root: Path) -> tuple[int, Path]:
    """``step``'s checkpoint, or the latest; one line naming the steps there are when it is absent."""
    if not steps:
        raise ConfigError(f"{root}: no checkpoint in this run (was checkpointing on?)")
    if step is None:
        step = max(steps)
    if step not in steps:
        raise ConfigError(f"--step {step}: no checkpoint of that step under {root} (steps: "
                          f"{', '.join(map(str, sorted(steps)))})")
    return step, steps[step]


def read_dcp_tensors(path: Path, select: Callable[[str], bool]) -> dict[str, Any]:
    """Every selected tensor of a DCP checkpoint (Megatron torch_dist is DCP too), at its global shape."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata) and select(key)}
    if not state:
        raise ConfigError(f"{path}: no model tensors in this checkpoint")
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state
