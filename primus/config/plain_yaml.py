"""YAML as plain data, within bounds: hostile input is one line (exit 2) in bounded time and memory.

Configs hold strings, numbers, booleans, nulls, lists and string-keyed mappings; PyYAML's
SafeLoader also builds dates, bytes, sets and ordered pairs, which no engine setting takes,
so those tags are refused (``2024-01-01`` stays the string it looks like).

Real experiment files are a few kilobytes, a dozen levels deep, with keys of a few dozen
characters and integers far below 2**63. Anything beyond the bounds below is refused, naming
where it came from, before it can exhaust memory (YAML alias bombs), the stack (deep nesting)
or an engine (a 5000-digit step count).
"""
from __future__ import annotations

from typing import Any

import yaml

from primus.config.errors import ConfigError

MAX_FILE_BYTES = 4 * 2**20  # one config file
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_NODES = 200_000  # scalars + containers of one document once aliases are expanded
MAX_KEY_CHARS = 256  # one key, or one dotted command-line key
MAX_KEY_SEGMENTS = 32  # segments of a dotted command-line key
MAX_INT = 2**63 - 1  # integers beyond int64 fit no engine setting
_NOT_PLAIN = ("timestamp", "binary", "set", "omap", "pairs")


class PlainLoader(yaml.SafeLoader):
    """SafeLoader without the implicit timestamp type and without the non-plain tags."""


PlainLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _refuse(loader: PlainLoader, node: yaml.Node):
    raise yaml.constructor.ConstructorError(None, None, f"the YAML tag {node.tag} is not plain data (write a string)",
                                            node.start_mark)


for _name in _NOT_PLAIN:
    PlainLoader.add_constructor(f"tag:yaml.org,2002:{_name}", _refuse)


def check_int(value: Any, where: str) -> Any:
    """``value`` unchanged, or an error for an integer outside the signed 64-bit range."""
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT - 1 <= value <= MAX_INT:
        raise ConfigError(f"{where}: an integer of {len(str(abs(value)))} digits is out of range (at most {MAX_INT})")
    return value


def check_shape(value: Any, where: str) -> None:
    """Refuse data nested deeper than MAX_DEPTH or larger than MAX_NODES once aliases are expanded.
    Iterative and stopping at the bound: an alias bomb costs MAX_NODES steps, not its expansion."""
    stack, nodes = [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(f"{where}: more than {MAX_NODES} values once YAML aliases are expanded "
                              "(an alias bomb?)")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def check_dotted_key(key: str, where: str) -> None:
    if len(key) > MAX_KEY_CHARS or key.count(".") >= MAX_KEY_SEGMENTS:
        raise ConfigError(f"{where}: the key '{key[:40]}...' is too long ({len(key)} characters, "
                          f"{key.count('.') + 1} segments; at most {MAX_KEY_CHARS} and {MAX_KEY_SEGMENTS})")


def parse_value(text: str, where: str) -> Any:
    """One YAML value from a command line or an environment variable (plain data, within bounds)."""
    try:
        value = yaml.load(text, Loader=PlainLoader)  # noqa: S506 - PlainLoader is a SafeLoader
    except RecursionError:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise ConfigError(f"{where}: an integer of thousands of digits is out of range (at most {MAX_INT})") from None
    check_shape(value, where)
    _check_plain(value, where)
    return value


def _check_plain(value: Any, where: str) -> None:
    """String keys and int64 integers (depth already bounded by ``check_shape``)."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: keys must be strings, got {key!r:.40}")
            _check_plain(child, where)
    elif isinstance(value, list):
        for child in value:
            _check_plain(child, where)
    else:
        check_int(value, where)
