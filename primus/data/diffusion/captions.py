"""Find (video, caption) pairs in a folder, whichever caption format it uses.

Three layouts are understood, checked in this order:
  * ``meta.json``: a list of ``{"file_name": ..., "text": ...}`` (``video``/``caption``/``prompt``
    are accepted as synonyms);
  * ``metadata.csv``: columns ``file_name,text`` (the Hugging Face ``videofolder`` layout);
  * sidecar text files: ``clip.mp4`` + ``clip.txt``.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from primus.config.errors import ConfigError

VIDEO_SUFFIXES = (".mp4", ".mov", ".avi", ".mkv", ".webm", ".gif")
_FILE_KEYS = ("file_name", "video", "path", "video_path")
_TEXT_KEYS = ("text", "caption", "prompt")


@dataclass(frozen=True)
class Clip:
    video: Path
    caption: str


def _pick(entry: dict, keys: tuple[str, ...], where: str) -> str:
    for key in keys:
        if entry.get(key):
            return str(entry[key])
    raise ConfigError(f"{where}: entry {entry!r} has none of the keys {', '.join(keys)}")


def _from_meta_json(folder: Path) -> list[Clip]:
    path = folder / "meta.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a JSON list of {{file_name, text}} objects")
    return [Clip(folder / _pick(e, _FILE_KEYS, str(path)), _pick(e, _TEXT_KEYS, str(path))) for e in entries]


def _from_metadata_csv(folder: Path) -> list[Clip]:
    path = folder / "metadata.csv"
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [Clip(folder / _pick(r, _FILE_KEYS, str(path)), _pick(r, _TEXT_KEYS, str(path))) for r in rows]


def _from_sidecars(folder: Path) -> list[Clip]:
    clips = []
    for video in sorted(p for p in folder.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES):
        caption = video.with_suffix(".txt")
        if caption.exists():
            clips.append(Clip(video, caption.read_text(encoding="utf-8").strip()))
    return clips


def find_clips(folder: Path) -> list[Clip]:
    """All captioned clips in ``folder``; a caption whose video is missing is an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"video folder '{folder}' does not exist")
    if (folder / "meta.json").exists():
        clips = _from_meta_json(folder)
    elif (folder / "metadata.csv").exists():
        clips = _from_metadata_csv(folder)
    else:
        clips = _from_sidecars(folder)
    missing = [str(c.video) for c in clips if not c.video.exists()]
    if missing:
        raise ConfigError(f"{len(missing)} captioned video(s) not found, e.g. '{missing[0]}'")
    if not clips:
        raise ConfigError(
            f"no captioned videos in '{folder}': expected meta.json, metadata.csv (file_name,text) "
            f"or a .txt caption next to each video"
        )
    return clips
