"""The names Megatron-LM gives a checkpoint's files: ``iter_NNNNNNN`` per saved step and the tracker
that says which one is whole (read by saving, resharding and resuming alike)."""
from __future__ import annotations

from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
ITERATION = r"iter_(\d+)"  # the name of one saved step (what ``iteration_dir`` writes)
RELEASE = "release"  # Megatron-LM's tracker value for a converted model (weights only, iteration 0)


def iteration_dir(root: Path, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def latest_iteration(root: Path | None) -> int | None:
    if root is None:
        return None
    tracker = Path(root) / TRACKER
    if not tracker.exists():
        return None
    text = tracker.read_text().strip()
    if text == RELEASE:
        return 0
    return int(text) if text.isdigit() else None
