"""``python -m primus.prepare EXTRA``: ``primus prepare`` before the ``primus`` script exists
(a container's start: ``pip install --no-deps -e .`` then ``python -m primus.prepare core``)."""
import argparse
import sys

from primus.prepare.cli import register

parser = argparse.ArgumentParser(prog="python -m primus.prepare")
register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(["prepare", *sys.argv[1:]])
sys.exit(args.handler(args))
