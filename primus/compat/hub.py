"""Hugging Face Hub tokenizers named by id (``meta-llama/Llama-3.1-8B``), fetched once into the HF cache.

AMD Primus's model presets name their tokenizer by Hub id and its blog says ``export HF_TOKEN=…``;
here the same id works: on each node local rank 0 downloads the tokenizer files with
``huggingface_hub`` (``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HOME`` honoured as usual) while the other
local ranks wait for the files to appear in the cache. Without network the run stops with one
line saying to point ``tokenizer_model`` / ``hf_assets_path`` at a local directory.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from primus.config.errors import ConfigError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a tokenizer needs (Hugging Face tokenizers, SentencePiece, tiktoken-style BPE) and the model
# config TorchTitan reads next to it; never weights.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "tiktoken.model", "vocab.json", "merges.txt", "config.json", "generation_config.json"]


def is_hub_id(reference: object) -> bool:
    """``org/name`` that is not a local path (a directory of that name wins, as in ``from_pretrained``)."""
    if not isinstance(reference, str) or not _HUB_ID.match(reference):
        return False
    return not Path(reference).expanduser().exists()


def _snapshot(repo_id: str, *, local_files_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, allow_patterns=TOKENIZER_FILES, local_files_only=local_files_only,
                                  token=os.environ.get("HF_TOKEN") or None))


def _marker(repo_id: str) -> Path:
    """Written by local rank 0 once every file is in the cache (the cache's refs appear earlier)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ".primus-fetched" / repo_id.replace("/", "--")


def fetch_tokenizer(repo_id: str, *, key: str, local_rank: int = 0, wait_s: float = 1800.0) -> Path:
    """The local snapshot directory of ``repo_id``'s tokenizer files (downloaded once, by local rank 0)."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise ConfigError(f"{key}: '{repo_id}' is a Hugging Face Hub id, and huggingface_hub is not installed: "
                          f"pip install huggingface_hub, or point {key} at a local directory") from None
    marker = _marker(repo_id)
    if local_rank == 0:
        path = _download(repo_id, key)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(path))
        return path
    deadline = time.monotonic() + wait_s
    while True:  # local rank 0 is downloading into the shared cache
        if marker.exists() and Path(marker.read_text()).is_dir():
            return Path(marker.read_text())
        if time.monotonic() > deadline:
            raise ConfigError(f"{key}: local rank 0 did not fetch '{repo_id}' within {wait_s:.0f} s")
        time.sleep(0.5)


def _download(repo_id: str, key: str) -> Path:
    try:
        return _snapshot(repo_id, local_files_only=True)  # fetched before: no network needed
    except Exception:
        pass
    try:
        return _snapshot(repo_id, local_files_only=False)
    except Exception as exc:  # offline, gated without HF_TOKEN, unknown repo: one line, no traceback
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(
            f"{key}: cannot fetch the tokenizer '{repo_id}' from the Hugging Face Hub ({type(exc).__name__}: "
            f"{reason}); point {key} at a local directory holding tokenizer.json (or export HF_TOKEN for a "
            f"gated repo)") from None
