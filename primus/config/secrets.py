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
# A key is a secret by whole words of its last segment, never by substring: `hf_token`,
# `access_token`, `wandb_api_key`, `client_secret`, `db_password` are; `tokenizer_type`,
# `tokenizer_model`, `fim_pad_token`, `max_tokens`, `num_tokens` are not. The word ends the key: Megatron-LM's
# `moe_token_dispatcher_type`, `calculate_per_token_loss` are settings (meg: redacting them broke every MoE run).
_SECRET_WORDS = re.compile(
    r"(^|_)(token|secret|secrets|password|passwd|api_?key|apikey|access_key|secret_key|private_key|"
    r"credential|credentials)$", re.I)
# Tokenizer vocabulary entries that end in `_token` but hold a token string, not a credential.
_SPECIAL_TOKEN = re.compile(
    r"(^|_)(bos|eos|eod|pad|unk|sep|cls|mask|prefix|suffix|middle|special|start|end|image|video|audio)_token$",
    re.I)
_SECRET_ENV = re.compile(r"(_TOKEN|_KEY|_SECRET)$|PASSWORD|PASSWD", re.I)


def is_secret_key(key: str) -> bool:
    """True for the dotted key's last segment naming a credential (see the examples above)."""
    name = key.rsplit(".", 1)[-1]
    if name.lower().startswith("tokenizer") or _SPECIAL_TOKEN.search(name):
        return False
    return bool(_SECRET_WORDS.search(name))


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name))


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking environment variables (long enough to be worth masking)."""
    return [value for name, value in env.items() if is_secret_env(name) and len(value) >= 4]


def _is_secret_value(value: Any) -> bool:
    """A credential is a non-empty scalar; a flag (``rl_skip_bos_token: true``) or null is not."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != ""


def redact_tree(tree: Any, templates: Mapping[str, str], prefix: str = "") -> Any:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if is_secret_key(str(key)) and _is_secret_value(value):
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
