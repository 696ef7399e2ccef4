"""Text corpus -> Megatron indexed dataset (``.bin`` tokens + ``.idx`` index), at real sizes.

The job of Megatron-LM's ``tools/preprocess_data.py`` (not in the megatron-core wheel), with the
files written by megatron-core's own ``IndexedDatasetBuilder`` in its ``DType.optimal_dtype``, so
``GPTDataset`` reads them as it reads Megatron-LM's. On top of it:

* the input is JSON Lines, Parquet or a dataset saved with ``save_to_disk`` (``corpus.py``), cut
  into shards that each worker process reads itself (nothing but the tokens travels back);
* a shard is tokenized at once (``tokenizers``' ``encode_batch``, one thread per worker, so
  throughput per core is honest); the shards come back in input order, so the same input and
  tokenizer give byte-identical files whatever the number of workers;
* bad records are counted and named per file; above ``max_bad_fraction`` of all records the build
  is refused and nothing is written (the files are moved into place only at the end).

One document per record; an end-of-document token is appended (as ``--append-eod``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.data.corpus import EMPTY, FileReport, Shard, input_files, plan_shards, read_shard

MAX_LINE_BYTES = 16 << 20  # a longer JSON line is a bad record, not a document
MAX_BAD_FRACTION = 0.01


@dataclass
class BuildResult:
    bin_path: Path
    idx_path: Path
    documents: int
    tokens: int
    records: int
    files: list[FileReport]
    seconds: float
    workers: int

    @property
    def bad(self) -> int:
        return sum(f.bad_count for f in self.files)


def resolve_tokenizer(reference: str | Path) -> Path:
    """The ``tokenizer.json`` of a local Hugging Face folder (or that file itself); a Hub id is fetched
    into the Hugging Face cache by the caller first (``data_cli``: ``primus.compat.hub``)."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    if (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    raise ConfigError(f"--tokenizer: no tokenizer.json in {reference} (a Hugging Face tokenizer folder or Hub id)")


def eod_id(tokenizer_file: Path) -> int:
    """The end-of-document id: the tokenizer's ``eos_token`` (tokenizer_config.json), else its last id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    config = tokenizer_file.parent / "tokenizer_config.json"
    eos = json.loads(config.read_text()).get("eos_token") if config.exists() else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    token_id = tokenizer.token_to_id(eos) if eos else None
    return token_id if token_id is not None else tokenizer.get_vocab_size() - 1


# -- worker side (one process per worker; nothing here imports torch) ---------------------------
_WORKER: dict[str, Any] = {}  # this worker process's tokenizer and settings, set once by _start_worker


def _start_worker(tokenizer_file: str, eod: int | None, dtype: str, text_key: str, max_line_bytes: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: throughput per core is per process
    from tokenizers import Tokenizer

    _WORKER.update(tokenizer=Tokenizer.from_file(tokenizer_file), eod=eod, dtype=dtype, text_key=text_key,
                   max_line_bytes=max_line_bytes)


def tokenize_shard(shard: Shard) -> tuple[Any, Any, list[tuple[int, str]], int]:
    """``(tokens, document lengths, [(record index, reason)] of bad records, records)`` of one shard."""
    import numpy

    texts, where, bad = [], [], []
    records = 0
    for index, (text, reason) in enumerate(read_shard(shard, _WORKER["text_key"], _WORKER["max_line_bytes"])):
        records = index + 1
        if reason is None:
            texts.append(text)
            where.append(index)
        else:
            bad.append((index, reason))
    eod = _WORKER["eod"]
    documents = []
    for index, encoding in zip(where, _WORKER["tokenizer"].encode_batch(texts)):
        if encoding.ids:
            documents.append(encoding.ids + [eod] if eod is not None else encoding.ids)
        else:
            bad.append((index, EMPTY))  # text that tokenizes to nothing
    bad.sort()
    lengths = numpy.fromiter(map(len, documents), dtype=numpy.int64, count=len(documents))
    tokens = numpy.fromiter((t for ids in documents for t in ids), dtype=_WORKER["dtype"], count=int(lengths.sum()))
    return tokens, lengths, bad, records


# -- main process ---------------------------------------------------------------------------------
def _results(shards: list[Shard], workers: int, init_args: tuple):
    """Each shard's result, in shard order: in this process, or from a pool of worker processes."""
    if workers <= 1:
        _start_worker(*init_args)
        yield from map(tokenize_shard, shards)
        return
    import multiprocessing

    # forkserver: workers start from a clean process (no torch threads, no tqdm monitor thread to fork)
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(workers, initializer=_start_worker, initargs=init_args) as pool:
        yield from pool.imap(tokenize_shard, shards, chunksize=1)


def build_indexed(inputs: list[str | Path], tokenizer: str | Path, output_prefix: str | Path, *,
                  text_key: str = "text", workers: int = 1, append_eod: bool = True,
                  max_bad_fraction: float = MAX_BAD_FRACTION, max_line_bytes: int = MAX_LINE_BYTES,
                  progress: bool | None = None) -> BuildResult:
    """Tokenize ``inputs`` into ``<output_prefix>.bin/.idx``; raises ConfigError (nothing written) on a
    missing input, no document at all, or more than ``max_bad_fraction`` of the records bad."""
    import numpy
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from tokenizers import Tokenizer
    from tqdm import tqdm

    start = time.perf_counter()
    files = input_files([Path(p) for p in inputs])
    tokenizer_file = resolve_tokenizer(tokenizer)
    vocab = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    dtype = DType.optimal_dtype(vocab)  # uint16 below 65500 ids, else int32 (preprocess_data.py's rule)
    shards = [shard for path, kind in files for shard in plan_shards(path, kind)]
    reports = {str(path): FileReport(str(path)) for path, _ in files}
    output_prefix = Path(output_prefix)
    output_prefix.parent.mkdir(parents=True, exist_ok=True)
    bin_path, idx_path = Path(f"{output_prefix}.bin"), Path(f"{output_prefix}.idx")
    partial_bin, partial_idx = Path(f"{bin_path}.partial"), Path(f"{idx_path}.partial")
    builder = IndexedDatasetBuilder(str(partial_bin), dtype=dtype)
    init = (str(tokenizer_file), eod_id(tokenizer_file) if append_eod else None, numpy.dtype(dtype).name,
            text_key, max_line_bytes)
    bar = tqdm(total=sum(s.weight for s in shards), unit="B", unit_scale=True, desc="build-indexed",
               disable=None if progress is None else not progress)  # None: a bar on a terminal only
    try:
        for shard, (tokens, lengths, bad, records) in zip(shards, _results(shards, max(1, workers), init)):
            report = reports[shard.path]
            for index, reason in bad:
                report.add_bad(report.records + index + 1, reason)
            report.records += records
            report.documents += len(lengths)
            report.tokens += int(lengths.sum())
            builder.data_file.write(tokens.tobytes(order="C"))  # the builder's own file and index lists:
            first = len(builder.sequence_lengths)  # one sequence per document, as add_item + end_document
            builder.sequence_lengths.extend(lengths.tolist())
            builder.document_indices.extend(range(first + 1, first + 1 + len(lengths)))
            bar.update(shard.weight)
        bar.close()
        builder.finalize(str(partial_idx))
        result = BuildResult(bin_path, idx_path, sum(r.documents for r in reports.values()),
                             sum(r.tokens for r in reports.values()), sum(r.records for r in reports.values()),
                             list(reports.values()), 0.0, max(1, workers))
        _refuse_bad_input(result, max_bad_fraction)
        partial_bin.replace(bin_path)
        partial_idx.replace(idx_path)
    finally:
        bar.close()
        if not builder.data_file.closed:
            builder.data_file.close()
        for partial in (partial_bin, partial_idx):
            partial.unlink(missing_ok=True)
    result.seconds = time.perf_counter() - start
    return result


def _refuse_bad_input(result: BuildResult, max_bad_fraction: float) -> None:
    if result.documents == 0:
        raise ConfigError(f"no documents in {', '.join(f.path for f in result.files)}"
                          + (f" ({result.bad} bad records: {_worst(result)})" if result.bad else ""))
    share = result.bad / max(result.records, 1)
    if share > max_bad_fraction:
        raise ConfigError(f"{result.bad} of {result.records} records are bad ({share:.2%} > the allowed "
                          f"{max_bad_fraction:.2%}, --max-bad-fraction): {_worst(result)}; nothing written")


def _worst(result: BuildResult) -> str:
    worst = max(result.files, key=lambda f: f.bad_count)
    reasons = ", ".join(f"{n} {reason}" for reason, n in worst.bad.most_common())
    return f"{worst.path}: {reasons}" + (f" (first: {worst.examples[0]})" if worst.examples else "")


def report_lines(result: BuildResult) -> list[str]:
    """Per file: documents, tokens and bad records by reason (with the first few named); then the total."""
    lines = []
    for f in result.files:
        bad = "; ".join(f"{n} {reason}" for reason, n in f.bad.most_common()) or "none"
        lines.append(f"{f.path}: {f.documents} documents, {f.tokens} tokens, bad records: {bad}")
        lines += [f"  {example}" for example in f.examples if f.bad_count]
    rate = result.tokens / max(result.seconds, 1e-9)
    lines.append(f"total: {result.documents} documents, {result.tokens} tokens, {result.bad} of {result.records} "
                 f"records bad; {result.seconds:.1f} s, {rate:,.0f} tokens/s with {result.workers} worker(s) "
                 f"({rate / result.workers:,.0f} per worker)")
    return lines


def build_indexed_dataset(jsonl_path: str | Path, tokenizer_dir: str | Path, output_prefix: str | Path,
                          text_key: str = "text", append_eod: bool = True) -> tuple[Path, Path]:
    """One JSON Lines file, one process, no bad record allowed (the tiny corpus Primus builds itself)."""
    result = build_indexed([jsonl_path], tokenizer_dir, output_prefix, text_key=text_key, append_eod=append_eod,
                           max_bad_fraction=0.0, progress=False)
    return result.bin_path, result.idx_path
