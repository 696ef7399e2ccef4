"""``${VAR}`` and ``${VAR:default}`` substitution from the environment.

A string that is exactly one reference takes the value's YAML type (``${STEPS:20}`` is the
int 20); a reference embedded in a longer string is substituted as text. ``${VAR}`` with no
default must be set.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from primus.config.errors import ConfigError

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def _typed(text: str) -> Any:
    if text == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text


def interpolate_string(value: str, where: str, env: Mapping[str, str] | None = None) -> Any:
    env = os.environ if env is None else env

    def lookup(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (write ${{{name}:default}} to give one)")

    whole = _REFERENCE.fullmatch(value)
    if whole:
        return _typed(lookup(whole))
    return _REFERENCE.sub(lookup, value)


def interpolate_tree(
    data: Any, where_of: Callable[[str], str], templates: dict[str, str], prefix: str = ""
) -> Any:
    """Interpolate every string leaf; remember the raw template of each substituted key."""
    if isinstance(data, dict):
        return {
            key: interpolate_tree(value, where_of, templates, f"{prefix}.{key}" if prefix else key)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [interpolate_tree(item, where_of, templates, prefix) for item in data]
    if isinstance(data, str) and "${" in data:
        templates[prefix] = data
        return interpolate_string(data, where_of(prefix))
    return data
