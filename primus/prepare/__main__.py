"""``python -m primus.prepare EXTRA``: ``primus prepare`` before Primus' own dependencies exist
(a container's start: ``pip install --no-deps -e .``, then ``python -m primus.prepare core``).
Standard library only, like ``primus.prepare.pip``."""
import argparse
import sys

from primus.prepare.pip import prepare

parser = argparse.ArgumentParser(prog="python -m primus.prepare")
parser.add_argument("extra", help="core, or a backend's extra (torchtitan, megatron, automodel)")
parser.add_argument("--dry-run", action="store_true")
parser.add_argument("--force", action="store_true")
parser.add_argument("--quiet", action="store_true")
parser.add_argument("--with-te", action="store_true", help="megatron: Transformer Engine for the installed torch")
args = parser.parse_args()
sys.exit(prepare(args.extra, dry_run=args.dry_run, force=args.force, quiet=args.quiet, with_te=args.with_te))
