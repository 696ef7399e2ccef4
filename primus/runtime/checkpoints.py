"""Is a checkpoint whole? Checked before resuming from it, the same way for every backend.

TorchTitan writes ``checkpoints/step-N/`` and Megatron (torch_dist) ``checkpoints/iter_NNNNNNN/``:
both are ``torch.distributed.checkpoint`` directories whose ``.metadata`` (written last) names
the file, offset and length of every saved tensor and object. A checkpoint is usable when its
``.metadata`` loads, every file it names exists and is at least as long as the data it must
hold, and its small side files (Megatron's ``common.pt``, ``metadata.json``) are intact.

Megatron-LM's legacy layout (``ckpt_format: torch``) has no ``.metadata``: ``iter_NNNNNNN`` holds
one ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`` per model-parallel rank (and ``distrib_optim.pt``
with the distributed optimizer), and ``latest_checkpointed_iteration.txt`` is written once every
rank has saved. It is usable when the rank directories form a whole TP x PP x EP grid and every
file is an intact ``torch.save`` archive (each member passes its CRC); one newer than the tracker
is a save that never finished.

Resuming picks the newest usable checkpoint, warning about each newer one it skips (naming
the bad file), and refuses (exit 2, naming it) when there are checkpoints but none is usable.
A directory without ``.metadata`` is a save that never finished (the engines skip it too): it
is named in a warning but is no reason to refuse. Nothing is ever deleted: the launcher moves
a damaged checkpoint aside (``step-4`` -> ``step-4.damaged``) so that the resumed run cannot
overwrite it, and it stays there for the user to inspect.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

from primus.config.errors import ConfigError

logger = logging.getLogger("primus.checkpoints")

LAYOUTS = {"torchtitan": re.compile(r"^step-(\d+)$"), "megatron": re.compile(r"^iter_(\d+)$")}
LEGACY_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")  # Megatron-LM's get_checkpoint_name
LEGACY_FILES = ("model_optim_rng.pt", "distrib_optim.pt")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_OS_ERROR = re.compile(r"(?:\w*Error): \[Errno \d+\] [^\n]*")


class UnusableCheckpoint(ConfigError):
    """Checkpoints exist but none can be resumed from."""


def _legacy_rank_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and LEGACY_RANK_DIR.match(p.name)) if path.is_dir() else []


def _unfinished(path: Path) -> str | None:
    if _legacy_rank_dirs(path):
        tracker = path.parent / MEGATRON_TRACKER
        match = LAYOUTS["megatron"].match(path.name)
        text = tracker.read_text().strip() if tracker.is_file() else ""
        if match and (not text.isdigit() or int(match.group(1)) > int(text)):
            return f"{tracker} does not name {path.name} or a later iteration (the save did not finish)"
        return None
    metadata = path / ".metadata"
    return None if metadata.exists() else f"{metadata} is missing (the save did not finish)"


def _archive_problem(file: Path) -> str | None:
    """None when ``file`` is an intact ``torch.save`` (zip) archive."""
    try:
        with zipfile.ZipFile(file) as archive:
            if archive.testzip() is not None:
                raise zipfile.BadZipFile("a member fails its CRC")
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{file} is damaged ({exc})"
    return None


def _legacy_problem(path: Path) -> str | None:
    """What is wrong with a Megatron-LM legacy checkpoint: a hole in its rank grid, a file missing or damaged."""
    dirs = _legacy_rank_dirs(path)
    ranks = {tuple(int(g) for g in LEGACY_RANK_DIR.match(d.name).groups() if g is not None) for d in dirs}
    widths = {len(r) for r in ranks}
    if len(widths) > 1:
        return f"{path} mixes rank directory names of different layouts ({', '.join(d.name for d in dirs[:4])})"
    sizes = [max(r[i] for r in ranks) + 1 for i in range(widths.pop())]
    missing = [r for r in itertools.product(*map(range, sizes)) if r not in ranks]
    if missing:
        name = "mp_rank_" + "_".join(f"{v:02d}" if i == 0 else f"{v:03d}" for i, v in enumerate(missing[0]))
        return f"{path / name} is missing ({len(missing)} of the {len(ranks) + len(missing)} rank directories)"
    for directory in dirs:
        model = directory / LEGACY_FILES[0]
        if not model.is_file():
            return f"{model} is missing"
        for file in (directory / name for name in LEGACY_FILES):
            problem = _archive_problem(file) if file.is_file() else None
            if problem:
                return problem
    return None


def _foreign(path: Path, layout: str | None) -> str | None:
    """A Megatron checkpoint under TorchTitan's name (``step-N`` holding torch_dist's side files):
    whole, but not TorchTitan's. (The reverse cannot be told by its files: Megatron's
    ``fsdp_dtensor`` format is a plain DCP directory too; the resume shape check names it.)"""
    if layout == "torchtitan" and ((path / "metadata.json").exists() or (path / "common.pt").exists()):
        return f"{path} holds a Megatron checkpoint (metadata.json, common.pt), not TorchTitan's"
    return None


def problem_of(path: Path, layout: str | None = None) -> str | None:
    """None when the checkpoint directory is whole (and, given ``layout``, that engine's);
    else what is wrong, naming the bad file."""
    metadata = path / ".metadata"
    unfinished = _unfinished(path)
    if unfinished:
        return unfinished
    layout = layout or next((name for name, pattern in LAYOUTS.items() if pattern.match(path.name)), None)
    if _legacy_rank_dirs(path):
        if layout == "torchtitan":
            return f"{path} holds a Megatron-LM legacy checkpoint (mp_rank_* folders), not TorchTitan's"
        return _legacy_problem(path)
    if not metadata.is_file():
        return f"{metadata} is not a file"
    foreign = _foreign(path, layout)
    if foreign:
        return foreign
    from torch.distributed.checkpoint import FileSystemReader

    try:
        storage = FileSystemReader(str(path)).read_metadata().storage_data or {}
    except Exception as exc:  # noqa: BLE001 - any failure to read it means the same: unusable
        return f"{metadata} does not load ({type(exc).__name__}: {str(exc)[:80]})"
    needed: dict[str, int] = {}
    for info in storage.values():
        relative = getattr(info, "relative_path", None)
        if relative is not None:
            needed[relative] = max(needed.get(relative, 0), info.offset + info.length)
    for relative, size in sorted(needed.items()):
        file = path / relative
        if not file.is_file():
            return f"{file} is missing"
        actual = file.stat().st_size
        if actual < size:
            return f"{file} is truncated ({actual} of {size} bytes)"
    for side in sorted(path.glob("*.pt")):
        problem = _archive_problem(side)
        if problem:
            return problem
    for side in sorted(path.glob("*.json")):
        try:
            json.loads(side.read_text())
        except (OSError, ValueError) as exc:
            return f"{side} is damaged ({type(exc).__name__})"
    return None


def checkpoints_in(root: Path, layout: str | None = None) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint directory under ``root``, newest first. ``root``
    present but not a folder is refused (the engine could neither read nor save there)."""
    patterns = [LAYOUTS[layout]] if layout else list(LAYOUTS.values())
    found = []
    if Path(root).exists() and not Path(root).is_dir():
        raise UnusableCheckpoint(f"{root} is not a folder: move it away (checkpoints are saved in a folder of "
                                 "that name)")
    if Path(root).is_dir():
        for child in Path(root).iterdir():
            for pattern in patterns:
                match = pattern.match(child.name)
                if match and child.is_dir():
                    found.append((int(match.group(1)), child))
    return sorted(found, key=lambda item: item[0], reverse=True)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint out of the engines' sight (``<name>.damaged``, then ``.damaged-2``, ...)."""
    target, n = path.with_name(f"{path.name}.damaged"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{n}")
    path.rename(target)
    return target


def newest_usable(root: Path, layout: str | None = None, *, at_most: int | None = None,
                  warn: Callable[[str], None] | None = None, move_damaged: bool = False) -> int | None:
    """The step of the newest whole checkpoint under ``root`` (at most ``at_most``), or None when
    there is no checkpoint at all. Each newer, damaged one is named in a warning (and moved aside
    with ``move_damaged``); when every one is damaged, ``UnusableCheckpoint`` names the newest."""
    warn = warn or logger.warning
    candidates = [(step, path) for step, path in checkpoints_in(root, layout) if at_most is None or step <= at_most]
    skipped: list[str] = []  # problems of the newer checkpoints, newest first
    damaged: list[tuple[Path, str]] = []  # those that finished saving and are broken since
    for step, path in candidates:
        problem = problem_of(path, layout)
        if problem is None:
            for line in skipped:
                warn(f"checkpoint not usable, skipped: {line}; resuming from {path} instead (nothing was deleted)")
            if move_damaged:
                for bad, _ in damaged:
                    warn(f"moved the damaged checkpoint {bad} to {set_aside(bad)}, so that this run cannot overwrite it")
            return step
        skipped.append(problem)
        if not _unfinished(path):
            damaged.append((path, problem))
    if damaged:
        raise UnusableCheckpoint(f"{root}: no usable checkpoint to resume from; the newest: {damaged[0][1]} "
                                 f"({len(skipped)} checked, nothing was deleted; move the damaged ones away to "
                                 "start from scratch)")
    for line in skipped:
        warn(f"checkpoint not usable, skipped: {line}; starting from scratch (nothing was deleted)")
    return None


def save_errors() -> tuple[type[BaseException], ...]:
    """What a failed save raises (``except save_errors()``): torch DCP's ``CheckpointException`` derives
    from ``BaseException``, so ``except Exception`` alone lets a failed write through."""
    from torch.distributed.checkpoint.api import CheckpointException

    return Exception, CheckpointException


def save_failure_cause(exc: BaseException, folder: Path) -> str:
    """Why a save failed, in a few words: the OS error inside the engine's exception (disk full,
    permission) when it names one; else, when the checkpoint's filesystem has under a MiB left (torch's
    zip writer reports a full disk as "unexpected pos"), that it is full. Call before removing the partial."""
    import shutil

    found = _OS_ERROR.findall(str(exc))
    if found:
        return found[-1].strip()
    cause = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return cause
    return f"No space left on device: {free} bytes free under {folder}; {cause}" if free < 2**20 else cause


def save_failed_warning(what: str, cause: str, removed: str, newest: str) -> str:
    """The one WARNING line of a checkpoint save that failed while training went on (every backend)."""
    return (f"checkpoint at {what} was not saved ({cause}){removed}; training goes on and {newest} "
            "(primus.checkpoint.fail_on_error: true stops the run instead)")


def pick_checkpoint(root: Path, layout: str, step: int | None = None, *,
                    warn: Callable[[str], None] | None = None) -> tuple[int, Path]:
    """The checkpoint to read (``primus export``): ``step``, which must be whole, or else the newest
    whole one, each newer damaged one named in a warning. Nothing is moved or deleted."""
    warn = warn or logger.warning
    found = checkpoints_in(root, layout)
    if not found:
        raise ConfigError(f"{root}: no checkpoint in this run (was checkpointing on?)")
    if step is not None:
        path = dict(found).get(step)
        if path is None:
            raise ConfigError(f"--step {step}: no checkpoint of that step under {root} (steps: "
                              f"{', '.join(str(s) for s, _ in reversed(found))})")
        problem = problem_of(path, layout)
        if problem:
            raise UnusableCheckpoint(f"--step {step}: {problem}")
        return step, path
    skipped: list[str] = []
    for newest, path in found:
        problem = problem_of(path, layout)
        if problem is None:
            for line in skipped:
                warn(f"checkpoint not usable, skipped: {line}; using {path} (step {newest}) instead")
            return newest, path
        skipped.append(problem)
    raise UnusableCheckpoint(f"{root}: no usable checkpoint; the newest: {skipped[0]}")


class CheckpointMismatch(ConfigError):
    """A whole checkpoint whose tensors do not fit the model (another shape, another engine)."""


def saved_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Global shape of every tensor a DCP checkpoint holds (TorchTitan's and Megatron's torch_dist
    ``.metadata`` record them), without reading a shard."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(path)).read_metadata()
    return {key: tuple(meta.size) for key, meta in metadata.state_dict_metadata.items()
            if isinstance(meta, TensorStorageMetadata)}


def gathered(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The union over every rank of the model's tensor shapes (a pipeline stage holds only its layers)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return shapes
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, shapes)
    return {key: shape for part in everyone for key, shape in part.items()}


def check_model_matches(path: Path, model: dict[str, tuple[int, ...]], is_model_key: Callable[[str], bool]) -> None:
    """Refuse (one line, before any step) a checkpoint whose model tensors are not exactly the model's:
    the first tensor, in the model's order, that the checkpoint lacks or holds in another shape, else
    the first one the checkpoint holds that the model has no place for. ``model``: the whole model's
    global shapes (``gathered``); ``is_model_key``: which checkpoint keys are the model's."""
    saved = {key: shape for key, shape in saved_shapes(path).items() if is_model_key(key)}
    problem = None
    for key, shape in model.items():
        if key not in saved:
            problem = f"tensor {key} {_shape(shape)} of the model is not in the checkpoint"
        elif saved[key] != tuple(shape):
            problem = f"tensor {key} is {_shape(saved[key])} in the checkpoint, {_shape(shape)} in the model"
        if problem:
            break
    if problem is None:
        extra = next((key for key in saved if key not in model), None)
        if extra is None:
            return
        problem = f"tensor {extra} {_shape(saved[extra])} of the checkpoint has no place in the model"
    raise CheckpointMismatch(f"{path}: does not match the model: {problem}; refused before any step (resume with "
                             "the settings it was trained with, or start a new exp_name)")


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
