"""Read one YAML file into a ``Layer``: plain data plus the file:line of every leaf.

PyYAML's SafeLoader does the parsing (as ``PlainLoader``: plain data, within the bounds of
``primus.config.plain_yaml``); a mapping constructor records key lines so every later error
and ``--why`` answer can point at the exact line. ``${VAR}`` interpolation happens here,
where the line of the offending string is known. Whatever the file holds, the outcome is
a Layer or one ``ConfigError`` line: never a traceback, never unbounded memory.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from primus.config.errors import ConfigError
from primus.config.interpolate import interpolate_tree
from primus.config.plain_yaml import (MAX_DEPTH, MAX_FILE_BYTES, MAX_KEY_CHARS, MAX_NODES, PlainLoader, check_int,
                                      check_shape)


class _LineDict(dict):
    """A dict that remembers the line of each key (1-based)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[Any, int] = {}


_MERGE = "tag:yaml.org,2002:merge"


class _LineLoader(PlainLoader):
    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """PyYAML's merge keys (``<<: *base``), bounded: merges of merges grow geometrically."""
        merged: list = []
        own = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in reversed(sources):  # earlier mappings in a merge list win
                if not isinstance(source, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(None, None, "a merge key (<<) takes a mapping or a "
                                                            "list of mappings", source.start_mark)
                self.flatten_mapping(source)
                if len(merged) + len(source.value) > MAX_NODES:
                    raise yaml.constructor.ConstructorError(None, None, f"merge keys (<<) expand to more than "
                                                            f"{MAX_NODES} entries", key_node.start_mark)
                merged.extend(source.value)
        node.value = merged + own
        node.merged = len(merged)  # entries before this index came from merge keys: own keys override them


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    merged = getattr(node, "merged", 0)
    mapping = _LineDict()
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            duplicate = key in mapping and index >= merged and mapping.lines[key] > 0
        except TypeError:  # a list or mapping as a key
            raise ConfigError(f"{loader.name}:{line}: keys must be strings, got a {type(key).__name__}") from None
        if duplicate:
            raise ConfigError(f"{loader.name}:{line}: duplicate key '{str(key)[:MAX_KEY_CHARS]}'")
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line if index >= merged else -line  # negative: inherited through a merge key
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class Layer:
    """One source of configuration values, with where each leaf came from."""

    label: str  # e.g. "module preset", "command line"
    data: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)  # dotted key -> "file:line" / token
    templates: dict[str, str] = field(default_factory=dict)  # dotted key -> raw "${VAR}" text


def _plain(value: Any, prefix: str, where: str, origins: dict[str, str], line: int = 1) -> Any:
    """Strip _LineDict down to dict, filling ``origins`` with file:line per dotted key.
    (Depth and size are bounded by ``check_shape`` before this recursion runs.)"""
    if isinstance(value, _LineDict):
        out = {}
        for key, child in value.items():
            key_line = abs(value.lines[key])
            if not isinstance(key, str):
                raise ConfigError(f"{where}:{key_line}: keys must be strings, got {key!r:.40}")
            if len(key) > MAX_KEY_CHARS:
                raise ConfigError(f"{where}:{key_line}: a key of {len(key)} characters is too long "
                                  f"(at most {MAX_KEY_CHARS})")
            dotted = f"{prefix}.{key}" if prefix else key
            origins[dotted] = f"{where}:{key_line}"
            out[key] = _plain(child, dotted, where, origins, key_line)
        return out
    if isinstance(value, list):
        return [_plain(item, prefix, where, origins, line) for item in value]
    return check_int(value, f"{where}:{line}")


_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))


def _read_text(path: Path, where: str) -> str:
    """The file as UTF-8 text, or one line saying why not (a directory, too large, another encoding)."""
    try:
        if path.is_dir():
            raise ConfigError(f"{where}: is a directory, not a YAML file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{where}: {size} bytes is too large for a config file (at most {MAX_FILE_BYTES})")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise ConfigError(f"{where}: the file is {encoding} text; save it as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8") from None


def _yaml_error(exc: yaml.YAMLError, text: str, where: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line = f":{mark.line + 1}"
    elif isinstance(getattr(exc, "position", None), int):  # ReaderError: a control character
        line = f":{text[:exc.position].count(chr(10)) + 1}"
    else:
        line = ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(f"{where}{line}: invalid YAML: {problem}")


def read_yaml(path: Path, where: str | None = None) -> Any:
    """The plain data of a YAML file, within the bounds of ``plain_yaml``, without interpolation
    (a file Primus wrote itself: ``config.resolved.yaml`` keeps secrets as ``${VAR}``)."""
    where = where or str(path)
    raw = _parse(_read_text(path, where), where)
    if isinstance(raw, (dict, list)):
        check_shape(raw, where)
    return _plain(raw, "", where, {})


def _parse(text: str, where: str) -> Any:
    loader = None
    try:
        loader = _LineLoader(text)  # the reader refuses control characters right here
        loader.name = where
        raw = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, where) from None
    except RecursionError:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise ConfigError(f"{where}: an integer of thousands of digits is out of range") from None
    finally:
        if loader is not None:
            loader.dispose()
    return raw


def load_yaml_layer(path: Path, label: str, display: str | None = None) -> Layer:
    """Parse ``path`` (must be a mapping) and interpolate ``${VAR}``/``${VAR:default}``."""
    where = display or str(path)
    raw = _parse(_read_text(path, where), where)
    if raw is None:
        raw = _LineDict()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}:1: expected a mapping at the top level, got {type(raw).__name__}")
    check_shape(raw, where)
    origins: dict[str, str] = {}
    data = _plain(raw, "", where, origins)
    templates: dict[str, str] = {}
    data = interpolate_tree(data, lambda key: origins.get(key, where), templates)
    return Layer(label=label, data=data, origins=origins, templates=templates)
