"""The documents of a text corpus on disk, in shards a worker process can read on its own, and
what is wrong with the records that are not documents.

A corpus is any mix of JSON Lines files (``.jsonl``, ``.json`` one object per line), Parquet
files and Hugging Face datasets saved with ``save_to_disk`` (a folder with ``state.json``, or a
``DatasetDict`` folder: its ``train`` split), given as files or folders (searched recursively,
in sorted order, so the same input always gives the same order).

A shard is a byte range of a JSON Lines file (cut at line ends), a row group of a Parquet file
or a range of rows of a saved dataset. Reading one yields, per record, the document text or
why the record is not one: bytes that are not UTF-8, a line over the size limit, text that is
not JSON or not an object, no text key, a text that is not a string, or an empty document.
Bad records are counted (and the first few named, ``file:line``), never silently dropped.
"""
from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from primus.config.errors import ConfigError

JSON_SUFFIXES = (".jsonl", ".json")
SHARD_BYTES = 4 << 20  # JSON Lines shards: small enough to spread a file over workers
ARROW_ROWS = 8192  # rows of a saved dataset per shard
KEEP_EXAMPLES = 5  # bad records named per file (all are counted)

NOT_UTF8, TOO_LONG, NOT_JSON, NOT_OBJECT = "not UTF-8", "line over the size limit", "not JSON", "not a JSON object"
NO_KEY, NOT_STRING, EMPTY, BLANK = "no text key", "text is not a string", "empty document", "blank line"


@dataclass(frozen=True)
class Shard:
    """One worker's part of one input: ``[start, stop)`` in bytes (jsonl), row groups (parquet) or rows (arrow)."""

    path: str
    kind: str  # "jsonl" | "parquet" | "arrow"
    start: int
    stop: int
    weight: int  # input bytes it stands for (the progress bar's unit)


@dataclass
class FileReport:
    """What one input file held: documents, tokens, and bad records by reason."""

    path: str
    records: int = 0
    documents: int = 0
    tokens: int = 0
    bad: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "file:line: reason", the first few

    @property
    def bad_count(self) -> int:
        return sum(self.bad.values())

    def add_bad(self, number: int, reason: str) -> None:
        self.bad[reason] += 1
        if len(self.examples) < KEEP_EXAMPLES:
            unit = "row " if not self.path.endswith(JSON_SUFFIXES) else ""
            self.examples.append(f"{self.path}:{unit}{number}: {reason}")


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def input_files(paths: list[Path]) -> list[tuple[Path, str]]:
    """``(path, kind)`` of every input, in a stable order; a missing or empty input is one ConfigError."""
    found: list[tuple[Path, str]] = []
    for path in paths:
        path = Path(path).expanduser()
        if path.is_dir() and _is_saved_dataset(path):
            found.append((path, "arrow"))
        elif path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file() and not f.name.startswith(".")
                           and f.suffix in (*JSON_SUFFIXES, ".parquet"))
            if not files:
                raise ConfigError(f"{path}: no .jsonl, .json or .parquet files (nor a dataset saved with save_to_disk)")
            found += [(f, "parquet" if f.suffix == ".parquet" else "jsonl") for f in files]
        elif path.is_file() and path.suffix in (*JSON_SUFFIXES, ".parquet"):
            found.append((path, "parquet" if path.suffix == ".parquet" else "jsonl"))
        elif path.is_file():
            raise ConfigError(f"{path}: not a .jsonl, .json or .parquet file")
        else:
            raise ConfigError(f"{path}: no such file or folder")
    return found


def plan_shards(path: Path, kind: str, shard_bytes: int | None = None) -> list[Shard]:
    """The shards of one input, in reading order."""
    shard_bytes = shard_bytes or SHARD_BYTES
    if kind == "jsonl":
        size = path.stat().st_size
        cuts = [0]
        with path.open("rb") as file:
            while cuts[-1] + shard_bytes < size:
                file.seek(cuts[-1] + shard_bytes)
                file.readline()  # to the end of the line the cut fell in
                if file.tell() >= size:
                    break
                cuts.append(file.tell())
        cuts.append(size)
        return [Shard(str(path), kind, a, b, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]
    if kind == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
        return [Shard(str(path), kind, g, g + 1, meta.row_group(g).total_byte_size) for g in range(meta.num_row_groups)]
    dataset = saved_dataset(str(path))
    rows = len(dataset)
    size = sum(Path(f["filename"]).stat().st_size for f in dataset.cache_files) or rows
    return [Shard(str(path), kind, a, min(a + ARROW_ROWS, rows), size * (min(a + ARROW_ROWS, rows) - a) // rows)
            for a in range(0, rows, ARROW_ROWS)]


@functools.lru_cache(maxsize=4)
def saved_dataset(path: str):
    """A dataset saved with ``save_to_disk`` (memory-mapped; a DatasetDict gives its train split)."""
    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(path)
    if isinstance(dataset, DatasetDict):
        if "train" not in dataset:
            raise ConfigError(f"{path}: a DatasetDict without a train split (splits: {', '.join(dataset)})")
        dataset = dataset["train"]
    return dataset


def _text_of(record: object, text_key: str) -> tuple[str | None, str | None]:
    if not isinstance(record, dict):
        return None, NOT_OBJECT
    if text_key not in record:
        return None, NO_KEY
    return _checked(record[text_key])


def _checked(text: object) -> tuple[str | None, str | None]:
    if not isinstance(text, str):
        return None, NOT_STRING if text is not None else NO_KEY
    return (None, EMPTY) if not text.strip() else (text, None)


def read_shard(shard: Shard, text_key: str, max_line_bytes: int) -> Iterator[tuple[str | None, str | None]]:
    """``(text, None)`` per document and ``(None, reason)`` per bad record, in order: one per line of a
    JSON Lines shard (blank lines included, so record i of a shard is line ``first line + i``), one
    per row otherwise."""
    if shard.kind == "jsonl":
        with open(shard.path, "rb") as file:
            file.seek(shard.start)
            data = file.read(shard.stop - shard.start)
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()  # the shard ends with a line end: no record after it
        for raw in lines:
            if len(raw) > max_line_bytes:
                yield None, TOO_LONG
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None, NOT_UTF8
                continue
            if not line.strip():
                yield None, BLANK
                continue
            try:
                record = json.loads(line)
            except ValueError:
                yield None, NOT_JSON
                continue
            yield _text_of(record, text_key)
    elif shard.kind == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(shard.path)
        rows = parquet.metadata.row_group(shard.start).num_rows
        if text_key not in parquet.schema_arrow.names:
            yield from [(None, NO_KEY)] * rows
            return
        for text in parquet.read_row_group(shard.start, columns=[text_key]).column(0).to_pylist():
            yield _checked(text)
    else:
        dataset = saved_dataset(shard.path)
        if text_key not in dataset.column_names:
            yield from [(None, NO_KEY)] * (shard.stop - shard.start)
            return
        for text in dataset[shard.start:shard.stop][text_key]:
            yield _checked(text)

