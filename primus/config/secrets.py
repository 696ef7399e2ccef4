"""Keep tokens and keys out of logs and saved configs.

A secret that came from ``${HF_TOKEN}`` is saved as that reference (workers re-read it from
their environment); a secret written literally is saved as ``<redacted>``.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from primus.config.interpolate import interpolate_string

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(r"(token|secret|passw(or)?d|api_?key|access_?key|private_?key|credential)", re.I)
_SECRET_ENV = re.compile(r"(_TOKEN|_KEY|_SECRET)$|PASSWORD|PASSWD", re.I)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key.rsplit(".", 1)[-1]))


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name))


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking environment variables (long enough to be worth masking)."""
    return [value for name, value in env.items() if is_secret_env(name) and len(value) >= 4]


def redact_tree(tree: Any, templates: Mapping[str, str], prefix: str = "") -> Any:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if is_secret_key(str(key)) and not isinstance(value, (dict, list)) and value not in (None, ""):
                out[key] = templates.get(dotted, REDACTED)
            else:
                out[key] = redact_tree(value, templates, dotted)
        return out
    if isinstance(tree, list):
        return [redact_tree(item, templates, prefix) for item in tree]
    return tree


def restore_secrets(tree: Any, prefix: str = "") -> Any:
    """On a worker: resolve ``${VAR}`` references that were kept for secret keys."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if is_secret_key(str(key)) and isinstance(value, str) and "${" in value:
                out[key] = interpolate_string(value, dotted)
            else:
                out[key] = restore_secrets(value, dotted)
        return out
    if isinstance(tree, list):
        return [restore_secrets(item, prefix) for item in tree]
    return tree


def mask_text(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text
