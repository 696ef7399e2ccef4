"""``primus prepare <extra>``: the CLI hook the lead wires in (``register(subparsers)``)."""
from __future__ import annotations

import argparse

from primus.prepare.pip import extras, prepare


def _run(args: argparse.Namespace, _overrides: list[str] | None = None) -> int:
    return prepare(args.extra, dry_run=args.dry_run, force=args.force, quiet=args.quiet, with_te=args.with_te)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare", help="install a backend's pinned stack without replacing the installed torch",
        description="Installs requirements/<extra>.txt with a pip constraint file that freezes the torch, "
                    "torchvision, torchaudio and triton already installed (a GPU image's ROCm/CUDA build).")
    p.add_argument("extra", choices=extras())
    p.add_argument("--dry-run", action="store_true", help="print the pip commands and the constraint file")
    p.add_argument("--force", action="store_true", help="run pip even when the pins are already installed")
    p.add_argument("--quiet", action="store_true", help="only pip's errors")
    p.add_argument("--with-te", action="store_true",
                   help="megatron: also Transformer Engine for the installed CUDA or ROCm torch (FP8, context "
                        "parallel); refused on a CPU torch")
    p.set_defaults(handler=_run)
