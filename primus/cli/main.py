"""``primus``: parse, resolve, delegate. No torch or engine import happens here."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from primus import __version__
from primus.cli.failures import OneLineParser, report_internal_error, report_user_error
from primus.cli.plugins import register_optional
from primus.config.errors import ConfigError
from primus.logs.held import hold_records_until_logs_exist

# Subcommand modules, each exposing register(subparsers). Optional ones may be absent.
COMMANDS = [
    "primus.cli.train",
    "primus.cli.config_cmd",
    "primus.prepare.cli",
    "primus.cli.data",
    "primus.preflight.cli",
    "primus.cli.plan",
    "primus.cli.export",
    "primus.cli.patches",
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="primus", allow_abbrev=False,
        description="One experiment file, one command: train with TorchTitan, Megatron or NeMo AutoModel.",
    )
    parser.add_argument("--version", action="version", version=f"primus {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_optional(COMMANDS, subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every way a command can end: its status; a user error is one line (exit 2), anything
    unexpected one line pointing at a debug log (exit 1), never a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return code
    except BrokenPipeError:  # `primus plan ... | head -1`: the reader left; end quietly, as `yes | head` does
        _silence_stdout()
        return 141
    except ConfigError as exc:
        return report_user_error(exc)
    except KeyboardInterrupt:
        print("primus: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns a bug into one line + a debug log
        return report_internal_error(exc, argv, verbose=_verbose(argv))


def _verbose(argv: list[str]) -> bool:
    return "--verbose" in argv or bool(os.environ.get("PRIMUS_VERBOSE"))


def _main(argv: list[str]) -> int:
    # Engines log through the root logger; before a run's log files exist (validation in the
    # launcher), keep their chatter and Python warnings off the user's terminal: held for the
    # run's warning.log (an in-process rank), dropped otherwise. Workers install real handlers.
    hold_records_until_logs_exist(verbose=_verbose(argv))
    # torch >= 2.13 logs a deprecation through its own stderr handler when torchao (installed for
    # AutoModel's LLM recipe, imported by TorchTitan too) registers its Enums at import: not the user's
    # business, and it would break the one-line error of a bad experiment.
    logging.getLogger("torch.utils._pytree").addFilter(
        lambda record: "register_constant() on Enum subclasses is deprecated" not in str(record.msg))
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0 if not argv else 2
    if extras and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return int(args.handler(args, extras) or 0)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
