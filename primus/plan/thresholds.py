"""Thresholds for findings: shipped defaults (``primus/preflight/thresholds.yaml``) merged with a user file.
(Here, in plan, because the launch reads them too: the usable fraction of a device's memory.)

A user file may hold any subset of the default keys. Unknown keys and values of the wrong
type are a ``ConfigError`` (one line, exit 2), as everywhere else in Primus.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

from primus.config.errors import ConfigError, did_you_mean

DEFAULTS_PATH = Path(__file__).parents[1] / "preflight" / "thresholds.yaml"  # shipped beside preflight, its main reader


def _check_range(dotted: str, value: float) -> None:
    """A share (``*_fraction``) lies in [0, 1]; a minimum is ≥ 0; an expected figure is > 0; all finite."""
    name = dotted.rsplit(".", 1)[-1]
    if name.endswith("_fraction"):
        low, high, what = 0.0, 1.0, "a share between 0 and 1"
    elif name.startswith("min_"):
        low, high, what = 0.0, 1e15, "a finite number ≥ 0"
    else:
        low, high, what = 1e-12, 1e15, "a finite number > 0"
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"threshold '{dotted}' must be {what}, got {value!r}")


def _merge(base: dict[str, Any], override: dict[str, Any], where: str) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in base:
            raise ConfigError(f"unknown threshold '{dotted}'{did_you_mean(key, base)}")
        default = base[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"threshold '{dotted}' must be a mapping, got {value!r}")
            merged[key] = _merge(default, value, dotted)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"threshold '{dotted}' must be true or false, got {value!r}")
            merged[key] = value
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"threshold '{dotted}' must be a number, got {value!r}")
            _check_range(dotted, value)
            merged[key] = type(default)(value) if isinstance(default, float) else value
        elif isinstance(default, list):
            if not isinstance(value, list):
                raise ConfigError(f"threshold '{dotted}' must be a list, got {value!r}")
            merged[key] = list(value)
        else:
            merged[key] = value
    return merged


def load_thresholds(user_path: str | Path | None = None) -> dict[str, Any]:
    """Defaults, overridden by ``user_path`` when given."""
    defaults = yaml.safe_load(DEFAULTS_PATH.read_text())
    if not user_path:
        return defaults
    path = Path(user_path)
    if not path.is_file():
        raise ConfigError(f"thresholds file not found: {path}")
    try:
        user = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"thresholds file {path} is not valid YAML: {exc}") from None
    if not isinstance(user, dict):
        raise ConfigError(f"thresholds file {path} must hold a mapping at the top level")
    return _merge(defaults, user, "")
