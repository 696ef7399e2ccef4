"""Command-line overrides: ``a.b=c``, ``--a.b c`` and ``--a.b=c``; values parsed as YAML.

Values are plain YAML data within the bounds of ``primus.config.plain_yaml``, and ``${VAR}``
references in them are interpolated as in a file (a secret given as ``${HF_TOKEN}`` is then
saved as that reference; executors hand literal secrets to other nodes this way).
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from primus.config.errors import ConfigError
from primus.config.interpolate import interpolate_tree
from primus.config.plain_yaml import check_dotted_key, parse_value
from primus.config.secrets import is_secret_key, redact_argv
from primus.config.yaml_source import Layer

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


_SCIENTIFIC = re.compile(r"^[-+]?\d+(\.\d*)?[eE][-+]?\d+$")


def _value(text: str, token: str) -> Any:
    """YAML scalars and lists; ``3e-4`` is a float here (YAML 1.1 would keep it a string)."""
    if _SCIENTIFIC.match(text):
        return float(text)
    try:
        return parse_value(text, f"command line '{token:.80}'") if text != "" else ""
    except yaml.YAMLError:
        raise ConfigError(f"command line: cannot parse the value in '{token:.80}' as YAML") from None


def parse_overrides(tokens: list[str]) -> list[tuple[str, Any, str]]:
    """Return ``(dotted_key, value, original_token)`` in command-line order (a secret's value
    masked in the token)."""
    parsed: list[tuple[str, Any, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--"):
            body = token[2:]
            if "=" in body:
                key, text = body.split("=", 1)
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                key, text = body, tokens[i + 1]
                token = f"{token} {text}"
                i += 1
            else:
                key, text = body, "true"
        elif "=" in token:
            key, text = token.split("=", 1)
        else:
            raise ConfigError(f"command line: '{token:.80}' is not an override (use key=value or --key value)")
        check_dotted_key(key, "command line")
        if not _KEY.match(key):
            raise ConfigError(f"command line: '{key}' in '{token:.80}' is not a dotted key")
        if is_secret_key(key):  # the token is named in errors and --why: never with a secret's value
            token = " ".join(redact_argv(token.split(" ", 1)))
        if len(token) > 100:  # ... and never as a wall of text
            token = f"{token[:80]}...({len(token)} characters)"
        parsed.append((key, _value(text, token), token))
        i += 1
    return parsed


def overrides_layer(items: list[tuple[str, Any, str]], label: str = "command line") -> Layer:
    """Nest dotted keys into one layer; each leaf's origin is its command-line token."""
    data: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, value, token in items:
        node = data
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            origins.setdefault(".".join(parts[: depth + 1]), f"command line '{token}'")
            node = child
        node[parts[-1]] = value
        origins[key] = f"command line '{token}'"
    templates: dict[str, str] = {}
    data = interpolate_tree(data, lambda key: _origin_of(origins, key), templates)
    return Layer(label=label, data=data, origins=origins, templates=templates)


def _origin_of(origins: dict[str, str], key: str) -> str:
    while key and key not in origins:
        key = key.rpartition(".")[0]
    return origins.get(key, "command line")
