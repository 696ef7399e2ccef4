"""Secrets reach the workers intact and nothing else: logs, saved configs, manifests, errors, scripts.

- A secret written as ``${HF_TOKEN}`` is saved as that reference; workers re-read it from
  their environment.
- A secret written literally (in a file, or on the command line) is handed to the workers in
  an environment variable the launcher sets (``PRIMUS_SECRET_<KEY>``), and the saved config
  holds the reference ``${PRIMUS_SECRET_<KEY>}``.
- ``config show`` prints a literal secret as ``<redacted>``; the manifest's command lines and
  every error message mask secret values; executors pass secrets by environment NAME only.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from primus.config.errors import mask_secrets, remember_secret
from primus.config.interpolate import SECRET_ENV_PREFIX, interpolate_string

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
_SECRET_ENV = re.compile(rf"(_TOKEN|_KEY|_SECRET)$|PASSWORD|PASSWD|^{SECRET_ENV_PREFIX}", re.I)


def is_secret_key(key: str) -> bool:
    """True for the dotted key's last segment naming a credential (see the examples above)."""
    name = str(key).rsplit(".", 1)[-1]
    if name.lower().startswith("tokenizer") or _SPECIAL_TOKEN.search(name):
        return False
    return bool(_SECRET_WORDS.search(name))


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name))


_ENVIRONMENT_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def is_secret_name(name: str) -> bool:
    """The one test for "never print this value": a secret key (``primus.hf_token``, ``HF_TOKEN``,
    ``WANDB_API_KEY``, ``db_password``; never ``tokenizer_type``) or, for a name written as an
    environment variable, a secret variable (``*_TOKEN``, ``*_KEY``, ``*_SECRET``, ``*PASSWORD*``)."""
    last = str(name).rsplit(".", 1)[-1]
    return is_secret_key(last) or (bool(_ENVIRONMENT_NAME.match(last)) and is_secret_env(last))


def shown_value(name: str, value: Any) -> Any:
    """What a line may print for ``name``'s value: ``<redacted>`` for a secret, else the value."""
    return REDACTED if is_secret_name(name) and _is_secret_value(value) else value


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking environment variables (long enough to be worth masking)."""
    return [value for name, value in env.items() if is_secret_env(name) and len(value) >= 4]


def _is_secret_value(value: Any) -> bool:
    """A credential is a non-empty scalar; a flag (``rl_skip_bos_token: true``) or null is not."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != ""


def secret_env_name(dotted: str) -> str:
    """The variable that carries a literal secret to the workers: ``PRIMUS_SECRET_PRE_TRAINER_PRIMUS_HF_TOKEN``."""
    parts = [p for p in str(dotted).split(".") if p not in ("modules", "params")]
    return SECRET_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", "_".join(parts)).upper()


def _is_reference(template: str | None) -> bool:
    """A template workers can re-read from their environment: references without a default
    (a default written in the file is itself a literal secret)."""
    return bool(template) and "${" in template and not re.search(r"\$\{[A-Za-z_][A-Za-z0-9_]*:", template)


def _walk_secrets(tree: Any, prefix: str, fn) -> Any:
    """Rebuild ``tree`` with ``fn(dotted, value)`` applied to every secret key's secret value."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            out[key] = fn(dotted, value) if is_secret_key(str(key)) and _is_secret_value(value) \
                else _walk_secrets(value, dotted, fn)
        return out
    if isinstance(tree, list):
        return [_walk_secrets(item, f"{prefix}.{i}" if prefix else str(i), fn) for i, item in enumerate(tree)]
    return tree


def _template_of(templates: Mapping[str, str], dotted: str) -> str | None:
    """Templates are recorded without list indices."""
    return templates.get(dotted) or templates.get(re.sub(r"\.\d+(?=\.|$)", "", dotted))


def redact_tree(tree: Any, templates: Mapping[str, str], prefix: str = "") -> Any:
    """For display (``config show``): references as written, literal secrets as ``<redacted>``."""
    return _walk_secrets(tree, prefix, lambda dotted, value: _template_of(templates, dotted)
                         if _is_reference(_template_of(templates, dotted)) else REDACTED)


def externalize_secrets(tree: Any, templates: Mapping[str, str]) -> tuple[Any, dict[str, str]]:
    """For saving: every secret becomes a ``${VAR}`` reference. Returns the tree and the variables
    the launcher must set for its workers (the literal secrets)."""
    env: dict[str, str] = {}

    def reference(dotted: str, value: Any) -> str:
        template = _template_of(templates, dotted)
        if _is_reference(template):
            return template
        name = secret_env_name(dotted)
        env[name] = str(value)
        return "${" + name + "}"

    return _walk_secrets(tree, "", reference), env


def restore_secrets(tree: Any, prefix: str = "") -> Any:
    """On a worker: resolve the ``${VAR}`` references kept for secret keys."""
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


def remember_secrets(tree: Any) -> None:
    """Every error message from now on masks the secret values found in ``tree``."""
    _walk_secrets(tree, "", lambda _dotted, value: remember_secret(str(value)))


def _override_parts(token: str, following: str | None) -> tuple[str, str, bool] | None:
    """(key, value, value_is_next_token) of a ``key=value`` / ``--key=value`` / ``--key value`` token."""
    body = token[2:] if token.startswith("--") else token
    if "=" in body:
        key, value = body.split("=", 1)
        return key, value, False
    if token.startswith("--") and following is not None and not following.startswith("-"):
        return body, following, True
    return None


def _rewrite_secret_overrides(tokens: Iterable[str], replace) -> list[str]:
    tokens = list(tokens)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        parts = _override_parts(token, tokens[i + 1] if i + 1 < len(tokens) else None)
        if parts and is_secret_key(parts[0]) and parts[1] != "":
            key, value, next_token = parts
            new = replace(key, value)
            if next_token:
                out += [token, new]
                i += 2
                continue
            out.append(f"{token[:len(token) - len(value)]}{new}")
        else:
            out.append(token)
        i += 1
    return out


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line as the manifest keeps it: secret overrides' values replaced by ``<redacted>``
    (references such as ``${HF_TOKEN}`` kept), other known secret values masked."""
    redacted = _rewrite_secret_overrides(argv, lambda _key, value: value if _is_reference(value) else REDACTED)
    return [mask_secrets(token) for token in redacted]


def secure_overrides(tokens: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """Command-line overrides for another process (a Slurm task, a container): a literal secret
    becomes ``${PRIMUS_SECRET_<KEY>}`` and its value goes into the returned environment, which
    the executor passes by NAME (docker ``-e NAME``, the environment of ``sbatch``/``srun``)."""
    env: dict[str, str] = {}

    def reference(key: str, value: str) -> str:
        if _is_reference(value):
            return value
        name = secret_env_name(key)
        env[name] = value
        return "${" + name + "}"

    return _rewrite_secret_overrides(tokens, reference), env


def mask_text(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text
