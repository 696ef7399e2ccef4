"""Values from outside an experiment file: command-line flags, environment variables, folders to write.

One helper per kind of value, shared by ``train``, ``plan``, ``preflight`` and ``export``, so that
``--nproc-per-node 0``, ``GPUS_PER_NODE=abc``, ``--timeout nan`` or an output folder below a regular
file end the same way everywhere: one ``ConfigError`` naming the flag or variable (exit 2). The
argparse ``type=`` wrappers turn these into argparse's own "argument --flag: …" line.
"""
from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from primus.config.errors import ConfigError

MAX_COUNT = 2**31 - 1  # processes, nodes, seconds: anything larger is a typo, and would overflow C ints


def parse_count(text: object, what: str, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """A whole number in [minimum, maximum]; ``what`` names the flag or variable in the error."""
    raw = str(text).strip()
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(f"{what}={text!r}: expected a whole number ≥ {minimum}") from None
    if not minimum <= value <= maximum:
        shown = raw if len(raw) <= 24 else f"{raw[:20]}... ({len(raw)} digits)"
        raise ConfigError(f"{what}={shown}: must be " + (f"≥ {minimum}" if value < minimum else f"≤ {maximum}"))
    return value


def parse_seconds(text: object, what: str, *, maximum: float = 7 * 24 * 3600.0) -> float:
    """A finite, positive number of seconds (``nan``, ``inf``, 0 and negatives are refused)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what}={text!r}: expected a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= maximum:
        raise ConfigError(f"{what}={text}: must be a finite number of seconds > 0 and ≤ {maximum:g}")
    return value


def env_count(name: str, env: Mapping[str, str] = os.environ, *, minimum: int = 1) -> int | None:
    """An integer environment variable (``NNODES``, ``GPUS_PER_NODE``, ``WORLD_SIZE``); None when unset or empty."""
    text = env.get(name, "")
    return None if text.strip() == "" else parse_count(text, f"${name}", minimum=minimum)


def check_output_folder(path: str | Path, what: str) -> Path:
    """``path`` as a folder this process can create or fill: refuses, naming ``what``, a path that is
    an existing file (``/dev/null`` too), a dangling symlink, one below a regular file, or one whose
    nearest existing parent is not writable. Creates nothing."""
    path = Path(path).expanduser()
    if str(path).strip() == "":
        raise ConfigError(f"{what}: an empty path")
    path = path.absolute()
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{what}: {path} is a symbolic link to {os.readlink(path)}, which does not exist")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what}: {path} exists and is not a folder")
    parent = path
    while not parent.exists():
        if parent.is_symlink():
            raise ConfigError(f"{what}: {parent} is a symbolic link to {os.readlink(parent)}, which does not exist")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what}: {path} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: {path} cannot be written: no write permission on {parent}")
    return path


# -- argparse types --------------------------------------------------------------------------------
def _flag_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type=``: the ConfigError's reason becomes argparse's "argument --flag: reason"."""
    def convert(text: str):
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(f"{str(exc).split(': ', 1)[-1]} (got {text!r})") from None
    return convert


def count_flag(minimum: int = 1, maximum: int = MAX_COUNT) -> Callable[[str], object]:
    return _flag_type(lambda text: parse_count(text, "value", minimum=minimum, maximum=maximum))


seconds_flag = _flag_type(lambda text: parse_seconds(text, "value"))


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ConfigError("value: must not be empty")
    return text


non_empty_flag = _flag_type(_non_empty)
