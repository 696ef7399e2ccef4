"""Read one YAML file into a ``Layer``: plain data plus the file:line of every leaf.

PyYAML's SafeLoader does the parsing; a mapping constructor records key lines so every
later error and ``--why`` answer can point at the exact line. ``${VAR}`` interpolation
happens here, where the line of the offending string is known.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from primus.config.errors import ConfigError
from primus.config.interpolate import interpolate_tree


class _LineDict(dict):
    """A dict that remembers the line of each key (1-based)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[Any, int] = {}


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    mapping = _LineDict()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping:
            raise ConfigError(f"{loader.name}:{line}: duplicate key '{key}'")
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class Layer:
    """One source of configuration values, with where each leaf came from."""

    label: str  # e.g. "module preset", "command line"
    data: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)  # dotted key -> "file:line" / token
    templates: dict[str, str] = field(default_factory=dict)  # dotted key -> raw "${VAR}" text


def _plain(value: Any, prefix: str, where: str, origins: dict[str, str]) -> Any:
    """Strip _LineDict down to dict, filling ``origins`` with file:line per dotted key."""
    if isinstance(value, _LineDict):
        out = {}
        for key, child in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}:{value.lines[key]}: keys must be strings, got {key!r}")
            dotted = f"{prefix}.{key}" if prefix else key
            origins[dotted] = f"{where}:{value.lines[key]}"
            out[key] = _plain(child, dotted, where, origins)
        return out
    if isinstance(value, list):
        return [_plain(item, prefix, where, origins) for item in value]
    return value


def load_yaml_layer(path: Path, label: str, display: str | None = None) -> Layer:
    """Parse ``path`` (must be a mapping) and interpolate ``${VAR}``/``${VAR:default}``."""
    where = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    loader = _LineLoader(text)
    loader.name = where
    try:
        raw = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}{line}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()
    if raw is None:
        raw = _LineDict()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}:1: expected a mapping at the top level, got {type(raw).__name__}")
    origins: dict[str, str] = {}
    data = _plain(raw, "", where, origins)
    templates: dict[str, str] = {}
    data = interpolate_tree(data, lambda key: origins.get(key, where), templates)
    return Layer(label=label, data=data, origins=origins, templates=templates)
