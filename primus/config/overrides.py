"""Command-line overrides: ``a.b=c``, ``--a.b c`` and ``--a.b=c``; values parsed as YAML."""
from __future__ import annotations

import re
from typing import Any

import yaml

from primus.config.errors import ConfigError
from primus.config.yaml_source import Layer

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


_SCIENTIFIC = re.compile(r"^[-+]?\d+(\.\d*)?[eE][-+]?\d+$")


def _value(text: str, token: str) -> Any:
    """YAML scalars and lists; ``3e-4`` is a float here (YAML 1.1 would keep it a string)."""
    if _SCIENTIFIC.match(text):
        return float(text)
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        raise ConfigError(f"command line: cannot parse the value in '{token}' as YAML") from None


def parse_overrides(tokens: list[str]) -> list[tuple[str, Any, str]]:
    """Return ``(dotted_key, value, original_token)`` in command-line order."""
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
            raise ConfigError(f"command line: '{token}' is not an override (use key=value or --key value)")
        if not _KEY.match(key):
            raise ConfigError(f"command line: '{key}' in '{token}' is not a dotted key")
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
    return Layer(label=label, data=data, origins=origins)
