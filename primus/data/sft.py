"""Instruction data for supervised fine-tuning, the same on every LLM backend.

A JSONL file (or a folder of JSONL / JSON / Parquet files, as a Hugging Face dataset repo stores
them) holds one conversation per record, either

* ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]}``
  rendered with the tokenizer's own chat template, or
* ``{"prompt": ..., "response": ...}`` (also ``input``/``output``, Alpaca's
  ``instruction`` + ``input`` + ``output``, or SQuAD's ``context`` + ``question`` + ``answers``),
  rendered with the chat template as one user and one assistant turn, or as Alpaca / ChatML /
  SQuAD / plain text (``conversation_format``, AMD Primus's wording for each).

Loss is taken on response tokens only: everything the template writes for an assistant turn
(its content and end-of-turn marker) and the final end-of-sequence token; system and user
turns and the template's scaffolding carry label ``IGNORE_INDEX``. Responses are located by
character offsets of the rendered text, so BPE merges across a boundary cannot shift the mask.

Sequences are either *padded* (one conversation per row: nothing to isolate) or *packed*
(several conversations per row; positions restart at 0 for each, so an engine can isolate them:
Megatron with a block-diagonal attention mask, TorchTitan with its document-aware FlexAttention
or varlen kernels). Conversations longer than the sequence are dropped, never truncated, and
counted. The order is a pure function of (seed, index), so every rank sees the same sequences and
a resumed run continues with exactly the batches an uninterrupted one would have seen.
"""
from __future__ import annotations

import codecs
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from primus.config.errors import ConfigError

IGNORE_INDEX = -100  # the label both engines' cross-entropy skips (torch's default ignore_index)
FORMATS = ("auto", "chat_template", "alpaca", "chatml", "squad", "plain")
Format = Literal["auto", "chat_template", "alpaca", "chatml", "squad", "plain"]
RECORD_SUFFIXES = (".parquet", ".jsonl", ".json")  # in this order of preference within a folder
# A file belongs to a split when a word of its path names it (Hub layouts: data/train-0000-of-0001.parquet,
# plain_text/validation-….parquet, dev.jsonl); files naming no split are training data.
_SPLIT_WORDS = {"train": "train", "training": "train", "validation": "valid", "valid": "valid", "val": "valid",
                "dev": "valid", "test": "test"}
_ALPACA_HEADER = ("Below is an instruction that describes a task. "
                  "Write a response that appropriately completes the request.\n\n")


class SFTDataSpec(BaseModel):
    """Where the instruction data is and how it becomes sequences (backend-neutral)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="JSONL file, or a folder of *.jsonl files")
    valid_path: str | None = Field(None, description="validation JSONL; default: a split of `path`")
    valid_fraction: float = Field(0.05, ge=0, lt=1, description="share of `path` held out when no valid_path")
    conversation_format: Format = "auto"
    packing: bool = Field(False, description="several conversations per sequence (else one, padded)")
    seed: int = 1234


@dataclass(frozen=True)
class Example:
    """One tokenized conversation: ids and, per id, whether it is a response token."""

    tokens: list[int]
    supervised: list[bool]


@dataclass
class SFTSequence:
    """One training row of ``seq_len`` tokens (inputs, shifted labels, per-document positions)."""

    inputs: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.inputs)


# -- reading -------------------------------------------------------------------------------------
def _split_of(relative: Path) -> str:
    words = [w for part in relative.with_suffix("").parts for w in re.split(r"[^a-z]+", part.lower())]
    return next((_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS), "train")


def record_files(path: str | Path, split: str = "train") -> list[Path]:
    """The files of one split: ``path`` itself, or the record files of a folder (searched recursively,
    one suffix: Parquet, else JSONL, else JSON), those of ``split`` by their names. Empty when the
    folder has none of that split (a folder with no split names is all training data)."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path] if split == "train" else []
    if path.is_dir():
        for suffix in RECORD_SUFFIXES:
            found = sorted(f for f in path.rglob(f"*{suffix}") if f.is_file() and not f.name.startswith("."))
            if found:
                return [f for f in found if _split_of(f.relative_to(path)) == split]
    raise ConfigError(f"{path}: no such instruction file (a .jsonl / .json / .parquet file or a folder of them)")


def jsonl_files(path: str | Path) -> list[Path]:
    """The training files under ``path`` (at least one; else one ConfigError saying what is there)."""
    files = record_files(path)
    if not files:
        held_out = record_files(path, "valid") + record_files(path, "test")
        if held_out:
            names = ", ".join(str(f.relative_to(path)) for f in held_out[:3]) + (", ..." if len(held_out) > 3 else "")
            raise ConfigError(f"{path}: holds only a validation/test split ({names}), no training records: add the "
                              "training files (named for the train split, or for no split at all)")
        raise ConfigError(f"{path}: no training records (files named for the train split, or no split at all)")
    return files


_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))


def _text(data: bytes, file: Path, number: int = 1) -> str:
    """``data`` (line ``number`` of ``file``, or all of it) as UTF-8 text, or one ConfigError naming file:line."""
    for bom, encoding in _BOMS:
        if number == 1 and data.startswith(bom):
            raise ConfigError(f"{file}: the file is {encoding} text; save it as UTF-8")
    try:
        return data.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        line = number + data[:exc.start].count(b"\n")
        raise ConfigError(f"{file}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8") \
            from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = where if where.count(":") else f"{where}:{exc.lineno}"
        raise ConfigError(f"{line}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deep to be an instruction record") from None
    except ValueError as exc:  # an integer of thousands of digits (sys.get_int_max_str_digits)
        raise ConfigError(f"{where}: not valid JSON ({' '.join(str(exc).split())[:120]})") from None


def _parquet_rows(file: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ConfigError(f"{file}: not a readable Parquet file ({' '.join(str(exc).split())[:160]})") from None
    yield from enumerate(table.to_pylist(), 1)


def _rows(file: Path):
    """``(line or row number, record)`` of one file; undecodable text or JSON is one ConfigError naming file:line."""
    if file.suffix == ".parquet":
        yield from _parquet_rows(file)
        return
    with file.open("rb") as handle:
        head = handle.read(64).lstrip(b" \t\r\n").removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n")
        handle.seek(0)
        if file.suffix == ".json" and head[:1] == b"[":
            yield from enumerate(_json(_text(handle.read(), file), str(file)), 1)
            return
        # JSON Lines (a .json file of one object per line, as many Hub datasets ship, too)
        for number, raw in enumerate(handle, 1):
            line = _text(raw, file, number)
            if line.strip():
                yield number, _json(line, f"{file}:{number}")


def _check_unicode(record: Any, where: str) -> None:
    """Every string of the record is valid Unicode: JSON's ``\\ud800`` escapes can make a lone
    surrogate, which no tokenizer can encode."""
    stack = [record]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ConfigError(f"{where}: a string holds a lone surrogate ({item[exc.start]!a}): not valid "
                                  "Unicode text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def read_records(path: str | Path, split: str = "train") -> list[tuple[str, dict[str, Any]]]:
    """``[(\"file:line\", record), ...]`` of every record of ``split``; a malformed one is one ConfigError."""
    records = []
    files = jsonl_files(path) if split == "train" else record_files(path, split)
    for file in files:
        for number, record in _rows(file):
            where = f"{file}:{number}"
            if not isinstance(record, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
            _check_unicode(record, where)
            records.append((where, record))
    if not records and split == "train":
        raise ConfigError(f"{path}: no instruction records")
    return records


def split_records(records: list, valid_fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic held-out share (at least one record when the fraction is > 0, and at least
    one left to train on: a share that holds out every record is one ConfigError)."""
    if valid_fraction <= 0 or len(records) < 2:
        return records, []
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(records) * valid_fraction))
    if n_valid >= len(records):
        raise ConfigError(f"valid_fraction {valid_fraction} of {len(records)} records holds out all of them: nothing "
                          "is left to train on (lower the fraction, or give a separate validation file)")
    held_out = set(order[:n_valid])
    return ([r for i, r in enumerate(records) if i not in held_out],
            [r for i, r in enumerate(records) if i in held_out])


# -- rendering -----------------------------------------------------------------------------------
def _squad(record: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """SQuAD's (context, question, first answer); Nones when the record is not SQuAD-shaped."""
    answers = record.get("answers")
    texts = answers.get("text") if isinstance(answers, dict) else answers
    answer = texts[0] if isinstance(texts, list) and texts else record.get("answer")
    return record.get("context"), record.get("question"), answer


_TEXT_KEYS = ("prompt", "response", "instruction", "input", "output", "system", "context", "question", "answer")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _prompt_response(record: dict[str, Any], where: str) -> tuple[str, str, str | None]:
    for key in _TEXT_KEYS:
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: `{key}` must be a string, got {type(value).__name__} {_short(value)}")
    response = record.get("response", record.get("output"))
    if "prompt" in record:
        prompt = record["prompt"]
    elif "instruction" in record:  # Alpaca: the optional `input` is context for the instruction
        prompt = record["instruction"]
        if isinstance(prompt, str) and record.get("input"):
            prompt += f"\n\n{record['input']}"
    elif "question" in record:  # SQuAD-style QA: the context comes first
        context, prompt, response = _squad(record)
        prompt = f"{context}\n\n{prompt}" if isinstance(context, str) and isinstance(prompt, str) else prompt
    else:
        prompt = record.get("input")
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise ConfigError(f"{where}: a record needs `messages`, or `prompt` and `response` strings "
                          f"(also `input`/`output`, `question`/`answers`); got keys {sorted(record)}")
    system = record.get("system")
    return prompt, response, system if isinstance(system, str) else None


def _messages(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: `messages` must be a non-empty list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ConfigError(f"{where}: each message needs `role` and `content` strings")
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(f"{where}: no assistant message: nothing to learn from")
    return messages


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render_chat(messages: list[dict[str, str]], tokenizer, where: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    def render(part, generation_prompt=False):
        return tokenizer.apply_chat_template(part, tokenize=False, add_generation_prompt=generation_prompt)

    full = render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(messages[:i], generation_prompt=True) if i else "", render(messages[: i + 1])
        if not (full.startswith(through) and through.startswith(before)):
            raise ConfigError(f"{where}: the tokenizer's chat template renders turns differently in context, "
                              "so the response tokens cannot be located; use prompt/response records with "
                              "conversation_format: alpaca or plain")
        spans.append((len(before), len(through)))
    return full, spans


def render(record: dict[str, Any], tokenizer, conversation_format: str = "auto",
           where: str = "record") -> tuple[str, list[tuple[int, int]]]:
    """``(text, response character spans)`` for one record."""
    if "messages" in record:
        if not has_chat_template(tokenizer):
            raise ConfigError(f"{where}: `messages` need a tokenizer with a chat template (none in its "
                              "tokenizer_config.json); use prompt/response records")
        return _render_chat(_messages(record, where), tokenizer, where)
    if conversation_format == "squad":  # AMD Primus / Megatron-Bridge: "Context: … Question: … Answer: …"
        context, question, answer = _squad(record)
        if not all(isinstance(v, str) for v in (context, question, answer)):
            raise ConfigError(f"{where}: conversation_format squad needs `context`, `question` and `answers` "
                              f"(or `answer`); got keys {sorted(record)}")
        head = f"{tokenizer.bos_token or ''}Context: {context.strip(' ')} Question: {question.strip(' ')} Answer:"
        tail = f" {answer.strip(' ')}"  # the space before the answer is supervised, as in AMD's formatter
        return head + tail, [(len(head), len(head) + len(tail))]
    prompt, response, system = _prompt_response(record, where)
    fmt = conversation_format
    if fmt == "auto":
        fmt = "chat_template" if has_chat_template(tokenizer) else "plain"
    if fmt == "chat_template":
        if not has_chat_template(tokenizer):
            raise ConfigError(f"{where}: conversation_format chat_template, but the tokenizer has no chat template")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return _render_chat(messages, tokenizer, where)
    tail = ""
    if fmt == "alpaca":  # AMD Primus / Stanford Alpaca wording
        head = (f"{system}\n\n" if system else _ALPACA_HEADER) + f"### Instruction:\n{prompt}\n\n### Response:\n"
    elif fmt == "chatml":  # AMD Primus's ChatML; the end-of-turn marker is learned too
        head = (f"<|im_start|>system\n{system}<|im_end|>\n" if system else "") + \
            f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        tail = "<|im_end|>"
    else:
        head = (f"{system}\n\n" if system else "") + prompt
    bos = tokenizer.bos_token or ""
    start = len(bos) + len(head)
    return bos + head + response + tail, [(start, start + len(response) + len(tail))]


def tokenize(record: dict[str, Any], tokenizer, conversation_format: str = "auto",
             where: str = "record") -> Example:
    """Token ids of one conversation, each marked supervised when it starts inside a response;
    an end-of-sequence token is appended (supervised: the model learns to stop)."""
    text, spans = render(record, tokenizer, conversation_format, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = list(encoded["input_ids"])
    supervised = [any(lo <= start < hi for lo, hi in spans) for start, _ in encoded["offset_mapping"]]
    eos = tokenizer.eos_token_id
    if eos is not None and (not tokens or tokens[-1] != eos):
        tokens.append(eos)
        supervised.append(True)
    return Example(tokens, supervised)


# -- sequences -----------------------------------------------------------------------------------
def _shifted(example: Example) -> tuple[list[int], list[int]]:
    inputs = example.tokens[:-1]
    labels = [t if s else IGNORE_INDEX for t, s in zip(example.tokens[1:], example.supervised[1:])]
    return inputs, labels


def build_sequences(examples: Iterable[Example], seq_len: int, pad_id: int, packing: bool) -> tuple[list[SFTSequence], int]:
    """Rows of exactly ``seq_len`` tokens, and how many conversations were too long to fit."""
    rows, current, dropped = [], SFTSequence(), 0

    def close(row: SFTSequence) -> None:
        pad = seq_len - len(row)
        if pad:  # padding is a document of its own: no loss, positions from 0
            row.inputs += [pad_id] * pad
            row.labels += [IGNORE_INDEX] * pad
            row.positions += list(range(pad))
        rows.append(row)

    for example in examples:
        inputs, labels = _shifted(example)
        if len(inputs) > seq_len or not inputs:
            dropped += 1
            continue
        if len(current) and (not packing or len(current) + len(inputs) > seq_len):
            close(current)
            current = SFTSequence()
        current.inputs += inputs
        current.labels += labels
        current.positions += list(range(len(inputs)))
    if len(current):
        close(current)
    return rows, dropped


def loss_targets(row: SFTSequence, fill: int = IGNORE_INDEX) -> tuple[list[int], list[bool]]:
    """Which positions of a row carry loss, and their targets: the one definition every backend's
    collator reads, so Megatron, TorchTitan and AutoModel learn from exactly the same tokens.

    Position i carries loss when its target, token i+1 of its conversation, is a response token
    (``tokenize``: assistant turns, their end-of-turn markers, the final end of sequence); prompts,
    the template's scaffolding, a conversation's first token and padding carry none. The targets
    hold ``fill`` where no loss is taken, because engines differ there: torch's cross entropy skips
    ``IGNORE_INDEX``; Megatron's vocab-parallel one needs a real token id and reads the mask instead."""
    carries = [label != IGNORE_INDEX for label in row.labels]
    return [label if loss else fill for label, loss in zip(row.labels, carries)], carries


def document_ids(positions: Sequence[int]) -> list[int]:
    """Which document each token belongs to: a new one wherever the position restarts at 0."""
    ids, doc = [], -1
    for position in positions:
        doc += position == 0
        ids.append(doc)
    return ids


class SFTSequences:
    """The rows of one split, read in an order that is a pure function of (seed, index):
    index i is row ``perm_e[i % n]`` of epoch ``e = i // n``, each epoch reshuffled."""

    def __init__(self, rows: list[SFTSequence], seed: int, dropped: int = 0, conversations: int = 0):
        if not rows:
            raise ConfigError("no instruction example fits the sequence length: raise it, or shorten the data")
        self.rows, self.seed, self.dropped, self.conversations = rows, seed, dropped, conversations
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int) -> SFTSequence:
        epoch, offset = divmod(index, len(self.rows))
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(self.seed + epoch).shuffle(order)
            self._orders = {epoch: order}  # keep one epoch: indices grow monotonically
        return self.rows[self._orders[epoch][offset]]

    def supervised_tokens(self) -> int:
        return sum(sum(loss_targets(row)[1]) for row in self.rows)


def load_tokenizer(path: str | Path):
    """The Hugging Face tokenizer of a model folder (tokenizer.json + tokenizer_config.json)."""
    path = Path(path).expanduser()
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ConfigError(f"{path}: no Hugging Face tokenizer (tokenizer.json / tokenizer_config.json)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def build_splits(spec: SFTDataSpec, tokenizer, seq_len: int) -> tuple[SFTSequences, SFTSequences | None]:
    """(train, valid) sequences; valid is None when nothing is held out."""
    records = read_records(spec.path)
    held_out = read_records(spec.path, "valid") if not spec.valid_path else []  # a dataset's own validation split
    if spec.valid_path:
        train_records, valid_records = records, read_records(spec.valid_path)
    elif held_out:
        train_records, valid_records = records, held_out
    else:
        train_records, valid_records = split_records(records, spec.valid_fraction, spec.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ConfigError("the tokenizer has neither a pad nor an end-of-sequence token")

    def split(records, seed):
        examples = [tokenize(r, tokenizer, spec.conversation_format, where) for where, r in records]
        rows, dropped = build_sequences(examples, seq_len, pad_id, spec.packing)
        return SFTSequences(rows, seed, dropped, len(examples))

    train = split(train_records, spec.seed)
    valid = split(valid_records, spec.seed + 1) if valid_records else None
    return train, valid


def describe(name: str, data: SFTSequences, packing: bool) -> str:
    """One log line: what the split holds and how it was laid out."""
    layout = "packed, documents isolated" if packing else "padded, one conversation per sequence"
    return (f"SFT {name}: {data.conversations} conversations -> {len(data)} sequences ({layout}), "
            f"{data.supervised_tokens()} response tokens carry the loss"
            + (f"; {data.dropped} longer than the sequence were dropped" if data.dropped else ""))
