"""``${VAR}`` and ``${VAR:default}`` substitution from the environment.

A string that is exactly one reference takes the value's YAML type (``${STEPS:20}`` is the
int 20); a reference embedded in a longer string is substituted as text. ``${VAR}`` with no
default must be set. A ``${`` that starts no valid reference (``${VAR:default`` without its
``}``) is an error, never a literal directory name. References to ``PRIMUS_SECRET_*``
(variables the launcher sets to hand a literal secret to its workers) are always text.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from primus.config.errors import ConfigError
from primus.config.plain_yaml import parse_value

SECRET_ENV_PREFIX = "PRIMUS_SECRET_"
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def _typed(text: str, where: str) -> Any:
    if text == "":
        return ""
    try:
        value = parse_value(text, where)  # an out-of-range integer is an error, not text
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text


def _check_references(value: str, where: str) -> None:
    start = value.find("${")
    while start != -1:
        if not _REFERENCE.match(value, start):
            end = value.find("}", start)
            snippet = value[start:end + 1 if end != -1 else start + 40]
            problem = "has no closing '}'" if end == -1 else "is not ${VAR} or ${VAR:default}"
            raise ConfigError(f"{where}: '{snippet[:60]}' {problem}")
        start = value.find("${", start + 2)


def interpolate_string(value: str, where: str, env: Mapping[str, str] | None = None) -> Any:
    env = os.environ if env is None else env
    _check_references(value, where)

    def lookup(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (write ${{{name}:default}} to give one)")

    whole = _REFERENCE.fullmatch(value)
    if whole:
        text = lookup(whole)
        return text if whole.group(1).startswith(SECRET_ENV_PREFIX) else _typed(text, where)
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
