"""Where ``primus export`` writes: OUT_DIR is checked before anything is read, one export writes it
at a time, and it appears whole or not at all.

The files go into a temporary sibling (``.OUT.partial-<pid>``) renamed to OUT_DIR at the end, so a
killed export (SIGKILL, a full disk) never leaves a folder that looks like a model, and the next
run finds OUT_DIR as it was. A lock beside OUT_DIR (``.OUT.export-lock``) refuses a second export
into the same folder while the first runs; the leftovers of a killed one are removed under it.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from primus.config.errors import ConfigError
from primus.config.values import check_output_folder
from primus.runtime.locks import exclusive


def check_target(out_dir: str | Path) -> Path:
    """OUT_DIR as an absolute path that can become the model folder: new, or an empty folder."""
    out = check_output_folder(out_dir, "OUT_DIR")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; export never overwrites (choose a new folder)")
    return out


@contextmanager
def claimed(out: Path) -> Iterator[None]:
    """Hold OUT_DIR for one export (a second one is refused), its leftovers cleared."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"OUT_DIR: {out} cannot be created ({exc.strerror})") from None
    with exclusive(out.parent / f".{out.name}.export-lock", what=f"OUT_DIR {out}"):
        check_target(out)  # again, under the lock: an export that finished meanwhile wrote it
        for stale in out.parent.glob(f".{out.name}.partial-*"):  # a killed export's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        yield


def write_atomically(out: Path, fill: Callable[[Path], object]) -> None:
    """``fill(folder)`` a fresh temporary sibling, then rename it to ``out``; on any failure remove
    it (an ``OSError`` such as a full disk becomes one line naming ``out``). Call under ``claimed``."""
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        partial.mkdir()
        fill(partial)
        os.rename(partial, out)  # atomic; replaces an empty folder, never a filled one
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError(f"OUT_DIR: cannot write {out} ({exc.strerror or exc}); nothing was left there") from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
