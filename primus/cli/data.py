"""``primus data ...``: build datasets and tokenizers locally."""
from __future__ import annotations

import argparse
from pathlib import Path

from primus.cli.plugins import register_optional


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="prepare datasets and tokenizers")
    actions = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    tiny = actions.add_parser("tiny-corpus", help="write a tiny learnable jsonl corpus and BPE tokenizer")
    tiny.add_argument("out", type=Path)
    tiny.add_argument("--docs", type=int, default=2000)
    tiny.set_defaults(handler=_tiny)
    from primus.runtime.registry import adapter_classes

    # each backend brings its own data commands (BackendAdapter.data_commands)
    register_optional([module for adapter in adapter_classes() for module in adapter.data_commands], actions)


def _tiny(args: argparse.Namespace, _overrides: list[str]) -> int:
    from primus.data.tiny_assets import ensure_tiny_assets

    paths = ensure_tiny_assets(args.out, n_docs=args.docs)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
