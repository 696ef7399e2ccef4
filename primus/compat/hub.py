"""Hugging Face Hub repos named by id (``meta-llama/Llama-3.1-8B``), fetched once into the HF cache.

AMD Primus's model presets name their tokenizer by Hub id, its SFT examples name the model to start
from (``hf_path``) and the instruction data (``sft_dataset_name: tatsu-lab/alpaca``) the same way, and
its blog says ``export HF_TOKEN=…``; here the same ids work: on each node local rank 0 downloads
what the run reads with ``huggingface_hub`` (``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HOME`` honoured as
usual) while the other local ranks wait for the files to appear in the cache. Without network the
run stops with one line saying to point the key at a local directory. ``config validate``, ``plan``
and ``--dry-run`` never download.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from primus.config.errors import ConfigError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a tokenizer needs (Hugging Face tokenizers, SentencePiece, tiktoken-style BPE) and the model
# config TorchTitan reads next to it; never weights.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "tiktoken.model", "vocab.json", "merges.txt", "config.json", "generation_config.json",
                   "chat_template.jinja"]
# A model to start from: its tokenizer and config plus the safetensors weights (never .bin / .pth copies).
MODEL_FILES = [*TOKENIZER_FILES, "*.safetensors", "*.safetensors.index.json"]
# Instruction data as the Hub stores it (Parquet conversions, or the author's JSON / JSONL).
DATASET_FILES = ["*.parquet", "*.jsonl", "*.json", "**/*.parquet", "**/*.jsonl", "**/*.json"]


def is_hub_id(reference: object) -> bool:
    """``org/name`` that is not a local path (a directory of that name wins, as in ``from_pretrained``)."""
    if not isinstance(reference, str) or not _HUB_ID.match(reference):
        return False
    return not Path(reference).expanduser().exists()


# What each kind of repo is fetched for: (repo_type, files, what the error line calls it).
_KINDS = {"tokenizer": ("model", TOKENIZER_FILES, "the tokenizer"),
          "model": ("model", MODEL_FILES, "the model"),
          "dataset": ("dataset", DATASET_FILES, "the dataset")}


@dataclass(frozen=True)
class HubTimeouts:
    """Seconds a Hub request may take (``primus.hub`` in the experiment): to connect, between two
    reads, and without any answer at all (across huggingface_hub's own retries). A Hub that never
    answers ends the fetch after ``stall``; a download whose bytes keep coming is never cut."""

    connect: float = 10.0
    read: float = 30.0
    stall: float = 90.0

    @classmethod
    def of(cls, params: dict) -> "HubTimeouts":
        hub = (params.get("primus") or {}).get("hub") or {}
        return cls(hub.get("connect_timeout_s", cls.connect), hub.get("read_timeout_s", cls.read),
                   hub.get("stall_timeout_s", cls.stall))


class HubStalled(Exception):
    """No answer from the Hub within ``HubTimeouts.stall`` seconds (raised inside huggingface_hub's
    HTTP client, which does not retry it)."""


class _Bounded:
    """An httpx request/response hook pair on huggingface_hub's shared session: every request gets
    the connect and read timeouts (its own calls pass ``timeout=None``, which means none), capped by
    what is left of the stall deadline, which every answer pushes back."""

    def __init__(self, timeouts: HubTimeouts):
        self.timeouts, self.deadline = timeouts, time.monotonic() + timeouts.stall

    def request(self, request) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HubStalled(f"no answer from {request.url.host} within {self.timeouts.stall:g} s")
        read, connect = min(self.timeouts.read, left), min(self.timeouts.connect, left)
        request.extensions["timeout"] = {"connect": connect, "read": read, "write": read, "pool": connect}

    def response(self, _response) -> None:
        self.deadline = time.monotonic() + self.timeouts.stall


def _bound_requests(timeouts: HubTimeouts) -> _Bounded:
    """Install the hooks (replacing an earlier fetch's) on the session huggingface_hub uses."""
    from huggingface_hub import constants, get_session

    session = get_session()
    hooks = session.event_hooks
    bounded = _Bounded(timeouts)
    for name in ("request", "response"):
        hooks[name] = [h for h in hooks[name] if not isinstance(getattr(h, "__self__", None), _Bounded)]
        hooks[name].append(getattr(bounded, name))
    session.event_hooks = hooks
    constants.HF_HUB_ETAG_TIMEOUT = constants.HF_HUB_DOWNLOAD_TIMEOUT = timeouts.read
    return bounded


def _snapshot(repo_id: str, kind: str, *, local_files_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    repo_type, files, _ = _KINDS[kind]
    return Path(snapshot_download(repo_id, repo_type=repo_type, allow_patterns=files,
                                  local_files_only=local_files_only, token=os.environ.get("HF_TOKEN") or None))


def _marker(repo_id: str, kind: str) -> Path:
    """Written by local rank 0 once every file is in the cache (the cache's refs appear earlier)."""
    from huggingface_hub import constants

    name = repo_id.replace("/", "--") + ("" if kind == "tokenizer" else f".{kind}")
    return Path(constants.HF_HUB_CACHE) / ".primus-fetched" / name


def fetch(repo_id: str, kind: str, *, key: str, local_rank: int = 0, wait_s: float = 1800.0,
          timeouts: HubTimeouts = HubTimeouts()) -> Path:
    """The local snapshot directory of a Hub repo's ``kind`` files: tokenizer, model (weights too) or
    dataset; downloaded once per node by local rank 0 while the others wait. When rank 0 cannot fetch
    it, every waiting rank ends with the same one line (a marker of this attempt says why)."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise ConfigError(f"{key}: '{repo_id}' is a Hugging Face Hub id, and huggingface_hub is not installed: "
                          f"pip install huggingface_hub, or point {key} at a local directory") from None
    marker = _marker(repo_id, kind)
    failed = marker.with_name(marker.name + ".failed")
    if local_rank == 0:
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            path = _download(repo_id, kind, key, timeouts)
        except ConfigError as exc:
            failed.write_text(json.dumps({"attempt": _attempt(), "error": str(exc)}))
            raise
        marker.write_text(str(path))
        return path
    deadline = time.monotonic() + wait_s
    while True:  # local rank 0 is downloading into the shared cache
        if marker.exists() and Path(marker.read_text()).is_dir():
            return Path(marker.read_text())
        why = _failure_of_this_attempt(failed)
        if why:
            raise ConfigError(why)
        if time.monotonic() > deadline:
            raise ConfigError(f"{key}: local rank 0 did not fetch '{repo_id}' within {wait_s:.0f} s")
        time.sleep(0.5)


def _attempt() -> str:
    """This launch attempt, the same on every rank of a node (torchrun's run id and restart count)."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _failure_of_this_attempt(failed: Path) -> str | None:
    try:
        record = json.loads(failed.read_text())
    except (OSError, ValueError):
        return None
    return record.get("error") if isinstance(record, dict) and record.get("attempt") == _attempt() else None


def _download(repo_id: str, kind: str, key: str, timeouts: HubTimeouts) -> Path:
    try:
        return _snapshot(repo_id, kind, local_files_only=True)  # fetched before: no network needed
    except Exception:
        pass
    holding = {"tokenizer": "holding tokenizer.json", "model": "holding config.json and *.safetensors",
               "dataset": "or file holding the records (.jsonl / .json / .parquet)"}[kind]
    bounded = _bound_requests(timeouts)
    try:
        return _snapshot(repo_id, kind, local_files_only=False)
    except Exception as exc:  # offline, silent, gated without HF_TOKEN, unknown repo: one line, no traceback
        import httpx

        stalled = next((e for e in _chain(exc) if isinstance(e, (HubStalled, httpx.TimeoutException))), None)
        if stalled is not None or time.monotonic() >= bounded.deadline:
            endpoint = os.environ.get("HF_ENDPOINT") or "the Hub"
            what = stalled if isinstance(stalled, HubStalled) else f"no answer from {endpoint}"
            reason = (f"{what} (timeouts: connect {timeouts.connect:g} s, read {timeouts.read:g} s, no answer "
                      f"{timeouts.stall:g} s; primus.hub.{{connect,read,stall}}_timeout_s)")
        else:
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200] or type(exc).__name__}"
        raise ConfigError(
            f"{key}: cannot fetch {_KINDS[kind][2]} '{repo_id}' from the Hugging Face Hub ({reason}); point {key} "
            f"at a local directory {holding} (or export HF_TOKEN for a gated repo)") from None


def _chain(exc: BaseException):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__
