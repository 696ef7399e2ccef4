"""``primus data build-indexed``: a text corpus -> Megatron ``.bin/.idx`` (what Megatron-LM's
``tools/preprocess_data.py`` does; that script is not in the megatron-core wheel)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(actions: argparse._SubParsersAction) -> None:
    from primus.data.indexed import MAX_BAD_FRACTION, MAX_LINE_BYTES

    parser = actions.add_parser(
        "build-indexed", help="tokenize a corpus (JSONL, Parquet, a saved HF dataset) into a Megatron .bin/.idx dataset")
    parser.add_argument("inputs", type=Path, nargs="+", metavar="INPUT",
                        help="a .jsonl/.json/.parquet file, a folder of them, or a dataset folder from save_to_disk")
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer folder (tokenizer.json) or Hub id")
    parser.add_argument("--output-prefix", type=Path, required=True, help="writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--text-key", default="text", help="the field holding each document's text")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                        help="tokenizing processes (default: one per core)")
    parser.add_argument("--max-bad-fraction", type=float, default=MAX_BAD_FRACTION,
                        help=f"refuse the build (nothing written) when more of the records are bad (default {MAX_BAD_FRACTION})")
    parser.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES,
                        help="a longer JSON line is a bad record")
    parser.add_argument("--no-eod", action="store_true", help="do not append an end-of-document token")
    parser.set_defaults(handler=_build_indexed)


def _local_tokenizer(reference: str) -> str:
    """A tokenizer named by Hub id, fetched once into the Hugging Face cache (``HF_TOKEN`` for gated
    repositories); a local folder or file as given."""
    from pathlib import Path

    from primus.compat.hub import fetch, is_hub_id

    if not Path(reference).expanduser().exists() and is_hub_id(str(reference)):
        return str(fetch(str(reference), "tokenizer", key="--tokenizer"))
    return reference


def _build_indexed(args: argparse.Namespace, _overrides: list[str]) -> int:
    from primus.config.errors import ConfigError
    from primus.data.indexed import build_indexed, report_lines

    if args.workers < 1:
        raise ConfigError(f"--workers: {args.workers}: at least 1")
    if not 0 <= args.max_bad_fraction <= 1:
        raise ConfigError(f"--max-bad-fraction: {args.max_bad_fraction}: a fraction between 0 and 1")
    result = build_indexed(args.inputs, _local_tokenizer(args.tokenizer), args.output_prefix, text_key=args.text_key,
                           workers=args.workers, append_eod=not args.no_eod, max_bad_fraction=args.max_bad_fraction,
                           max_line_bytes=args.max_line_bytes)
    print("\n".join(report_lines(result)))
    print(f"bin: {result.bin_path}\nidx: {result.idx_path}\ndata_path: [{args.output_prefix}]")
    return 0
