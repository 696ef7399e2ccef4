"""Whether an AutoModel checkpoint's data position can be resumed at this run's layout.

AutoModel 0.7.0 saves each dataloader's state once per data-parallel place (``save_on_dp_ranks``:
``dataloader/dataloader_dp_rank_<r>.pt``, r over dp x cp) and a resumed rank loads the file of its own
place. Each state counts the batches that place has taken from its own share of the sampler's order, so
at another data-parallel size the loaded counts skip the wrong samples (2 -> 1: rank 0 resumes at half
the samples consumed and repeats the other half), and places beyond the saved ones find no file. The
model and optimizer would reshard; the data would not, so such a resume is refused before any rank starts.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_STATE_FILE = re.compile(r"dataloader_dp_rank_(\d+)\.pt")


def data_places(section: dict[str, Any] | None, world_size: int) -> int:
    """The dataloader states a run at ``world_size`` saves: dp x cp (AutoModel's checkpointer keys them by
    ``_get_dp_rank(include_cp=True)``), dp defaulting to world / (tp x cp x pp)."""
    section = section or {}
    tp, cp, pp = (int(section.get(key) or 1) for key in ("tp_size", "cp_size", "pp_size"))
    dp = int(section.get("dp_size") or max(1, world_size // (tp * cp * pp)))
    return dp * cp


def saved_places(checkpoint: Path) -> int:
    """How many data-parallel places wrote a dataloader state into ``checkpoint`` (0: none saved)."""
    folder = checkpoint / "dataloader"
    return sum(1 for f in folder.iterdir() if _STATE_FILE.fullmatch(f.name)) if folder.is_dir() else 0


def data_position_problem(cfg: dict[str, Any], parallel_section: str, world_size: int | None,
                          resuming: bool) -> str | None:
    """Why the checkpoint this run would restore holds a data position it cannot continue, or None."""
    checkpoint_cfg = cfg.get("checkpoint") or {}
    restore = checkpoint_cfg.get("restore_from")
    if world_size is None or not checkpoint_cfg.get("enabled", True) or not (resuming or restore):
        return None
    root = Path(checkpoint_cfg["checkpoint_dir"])
    if restore in (None, "LATEST"):
        from nemo_automodel.components.checkpoint.utils import find_latest_checkpoint

        latest = find_latest_checkpoint(root)
        if latest is None:
            return None
        checkpoint = Path(latest)
    else:
        checkpoint = Path(restore) if Path(restore).is_absolute() else root / restore
    saved, places = saved_places(checkpoint), data_places(cfg.get(parallel_section), world_size)
    if saved in (0, places):
        return None
    return (f"{checkpoint} holds the data positions of {saved} data-parallel ranks, this run has {places}: "
            f"AutoModel 0.7.0 restores each rank's dataloader from the file of its own rank and cannot "
            f"reshard them (the resumed run would repeat or skip samples); resume on the layout that saved it")
