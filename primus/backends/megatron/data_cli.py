"""``primus data build-indexed``: jsonl -> Megatron ``.bin/.idx`` (what Megatron-LM's
``tools/preprocess_data.py`` does; that script is not in the megatron-core wheel)."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(actions: argparse._SubParsersAction) -> None:
    parser = actions.add_parser("build-indexed", help="tokenize a jsonl corpus into a Megatron .bin/.idx dataset")
    parser.add_argument("jsonl", type=Path, help="one JSON object per line")
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory holding tokenizer.json")
    parser.add_argument("--output-prefix", type=Path, required=True, help="writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--text-key", default="text")
    parser.add_argument("--no-eod", action="store_true", help="do not append an end-of-document token")
    parser.set_defaults(handler=_build_indexed)


def _build_indexed(args: argparse.Namespace, _overrides: list[str]) -> int:
    from primus.data.indexed import build_indexed_dataset

    bin_path, idx_path = build_indexed_dataset(args.jsonl, args.tokenizer, args.output_prefix,
                                               text_key=args.text_key, append_eod=not args.no_eod)
    print(f"bin: {bin_path}\nidx: {idx_path}\ndata_path: [{args.output_prefix}]")
    return 0
